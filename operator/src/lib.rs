//! The workerpool operator: the scaling engine and the tools built on it.

pub mod crd;
pub mod deployment;
pub mod scaling;
pub mod simulate;
