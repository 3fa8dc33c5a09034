//! The workerpool queue contract on Redis, shared by everything that reads
//! or writes a queue: the worker runtime, the `workerpool` command line and
//! the operator (its controller and local mode).
//!
//! - [`keys`]: the key layout, derived from the queue's name;
//! - [`job`]: the job envelope and intake (what a payload becomes);
//! - [`scripts`]: the Lua scripts that make each transition atomic;
//! - [`ops`]: the queue operations over those scripts;
//! - [`snapshot`]: everything a reader needs in one round trip;
//! - [`rate`]: a queue's rate limit (`20/s`), enforced by the taking scripts;
//! - [`schedule`]: the fires of recurring schedules, each enqueued once;
//! - [`memory`]: the server's eviction policy, and what it puts at risk;
//! - [`admin`]: inspecting and operating a queue from outside a worker;
//! - [`connection`]: how URLs are shown (and, later, connected to).
//!
//! The contract is documented in `docs/queue-contract.md`.

pub mod admin;
pub mod connection;
pub mod job;
pub mod keys;
pub mod memory;
pub mod ops;
pub mod outcome;
pub mod rate;
pub mod schedule;
pub mod scripts;
pub mod snapshot;
pub mod text;
