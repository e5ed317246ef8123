//! One module per command.

pub mod attach;
pub mod bench;
mod bench_console;
mod bench_drive;
mod bench_fork;
mod bench_gateway;
mod bench_pg;
mod bench_rounds;
mod bench_sandbox;
mod bench_server;
mod bench_sessions;
mod bench_steps;
mod bench_wake;
pub mod fake;
pub mod gc;
pub mod log;
pub mod manage;
pub mod remote;
pub mod replay;
pub mod run;
pub mod serve;
pub mod sessions;
pub mod wrapped;
