//! The workerpool operator: the scaling engine and the tools built on it.

pub mod controller;
pub mod crd;
pub mod deployment;
pub mod disruption;
pub mod events;
pub mod local;
pub mod metrics;
pub mod rbac;
pub mod run;
pub mod scaling;
pub mod schedule;
pub mod simulate;
pub mod watched;
pub mod workload;
