//! The errors of a reconcile, and why a queue could not be read.

use crate::deployment;

/// Errors of a reconcile, named after the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the pool's Deployment failed.
    #[error("reading the Deployment: {0}")]
    GetDeployment(#[source] kube::Error),
    /// Applying the pool's Deployment failed.
    #[error("applying the Deployment: {0}")]
    ApplyDeployment(#[source] kube::Error),
    /// Writing the pool's status failed.
    #[error("writing status: {0}")]
    PatchStatus(#[source] kube::Error),
    /// Listing the pool's pods failed.
    #[error("listing pods: {0}")]
    ListPods(#[source] kube::Error),
    /// Setting a pod's deletion cost failed.
    #[error("annotating a pod: {0}")]
    PatchPod(#[source] kube::Error),
    /// Reading the pool's PodDisruptionBudget failed.
    #[error("reading the PodDisruptionBudget: {0}")]
    GetBudget(#[source] kube::Error),
    /// Applying or deleting the pool's PodDisruptionBudget failed.
    #[error("writing the PodDisruptionBudget: {0}")]
    WriteBudget(#[source] kube::Error),
    /// The spec cannot be turned into a Deployment.
    #[error("invalid spec: {0}")]
    InvalidSpec(#[source] deployment::BuildError),
}

impl Error {
    /// Static label for metrics (never a Debug string).
    pub fn label(&self) -> &'static str {
        match self {
            Error::GetDeployment(_) => "get_deployment",
            Error::ApplyDeployment(_) => "apply_deployment",
            Error::PatchStatus(_) => "patch_status",
            Error::ListPods(_) => "list_pods",
            Error::PatchPod(_) => "patch_pod",
            Error::GetBudget(_) => "get_budget",
            Error::WriteBudget(_) => "write_budget",
            Error::InvalidSpec(_) => "invalid_spec",
        }
    }
}

/// Why the queue could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProblem {
    /// CamelCase reason for the condition and event.
    pub reason: &'static str,
    /// What happened and what to fix.
    pub message: String,
}
