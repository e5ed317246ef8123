//! The bundled demo: a small Python project with a failing test, and the script of a
//! model that finds the bug, fixes it, adds a regression test and reports.

use std::path::Path;

use crate::Script;

/// The demo task, as a user would type it.
pub const TASK: &str = "The test suite of this project fails. Find the bug, fix it, add a regression test, run the tests and report what you changed.";

const FILES: &[(&str, &str)] = &[
    ("stats.py", include_str!("../demo/project/stats.py")),
    (
        "test_stats.py",
        include_str!("../demo/project/test_stats.py"),
    ),
    ("README.md", include_str!("../demo/project/README.md")),
    ("CHANGELOG.md", include_str!("../demo/project/CHANGELOG.md")),
];

/// The demo model's script.
pub fn script() -> Script {
    Script::from_json(include_str!("../demo/script.json")).expect("the bundled script parses")
}

/// Writes the demo project into `dir` (created if needed).
pub fn write_project(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, content) in FILES {
        std::fs::write(dir.join(name), content)?;
    }
    Ok(())
}
