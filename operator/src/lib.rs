//! The workerpool operator: the scaling engine and the tools built on it.

pub mod scaling;
pub mod simulate;
