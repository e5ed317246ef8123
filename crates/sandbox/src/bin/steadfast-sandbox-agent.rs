//! The in-sandbox agent as its own program (the `steadfast` binary also carries it,
//! as `steadfast sandbox-agent`).

fn main() {
    std::process::exit(steadfast_sandbox::agent::main(std::env::args().skip(1)));
}
