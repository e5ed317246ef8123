//! Classifying tool calls: read, mutate or external (docs/ARCHITECTURE.md rule 4).
//!
//! The classification decides what happens when a call is cut off by a crash, so it
//! errs towards caution: a command is `read` only if every part of it is a known
//! read-only program with no output redirection, `external` if any part reaches the
//! network or publishes, and `mutate` otherwise.

use std::sync::OnceLock;

use regex::Regex;
use steadfast_log::ToolClass;

/// The class of a built-in tool call.
pub fn classify(tool: &str, input: &serde_json::Value) -> ToolClass {
    match tool {
        "read" | "glob" | "grep" => ToolClass::Read,
        "bash" => classify_command(input.get("command").and_then(|c| c.as_str()).unwrap_or("")),
        "service" => match input.get("action").and_then(|a| a.as_str()) {
            Some("logs" | "status") => ToolClass::Read,
            _ => ToolClass::Mutate,
        },
        _ => ToolClass::Mutate,
    }
}

/// The class of a shell command.
pub fn classify_command(command: &str) -> ToolClass {
    static EXTERNAL: OnceLock<Regex> = OnceLock::new();
    let external = EXTERNAL.get_or_init(|| {
        Regex::new(
            r"(?x)(^|[\s;&|(`$])(
                curl|wget|ssh|scp|sftp|rsync|nc|ncat|telnet|ftp|http|https|
                kubectl|helm|terraform|aws|gcloud|az|gh|
                git\s+(push|send-email|fetch|pull|clone|ls-remote)|
                (npm|yarn|pnpm|cargo|twine|gem|poetry)\s+publish|
                docker\s+(push|login)
            )(\s|$|;|&|\|)",
        )
        .expect("valid regex")
    });
    if external.is_match(command) {
        return ToolClass::External;
    }
    if is_read_only(command) {
        ToolClass::Read
    } else {
        ToolClass::Mutate
    }
}

fn is_read_only(command: &str) -> bool {
    if command.contains('>') || command.contains('`') || command.contains("$(") {
        return false;
    }
    let segments = command.split(['|', ';', '&', '\n']);
    let mut any = false;
    for segment in segments {
        let words: Vec<&str> = segment.split_whitespace().collect();
        let Some(program) = words.first() else {
            continue;
        };
        any = true;
        let ok = match *program {
            "ls" | "cat" | "head" | "tail" | "wc" | "pwd" | "echo" | "grep" | "rg" | "stat"
            | "file" | "du" | "df" | "which" | "tree" | "true" | "date" | "sort" | "uniq"
            | "cut" | "tr" | "diff" | "cmp" | "basename" | "dirname" | "realpath" | "nl"
            | "less" | "more" | "test" | "[" => true,
            "find" => !words
                .iter()
                .any(|w| matches!(*w, "-delete" | "-exec" | "-execdir" | "-ok" | "-fprint")),
            "sed" => !words
                .iter()
                .any(|w| w.starts_with("-i") || *w == "--in-place"),
            "git" => matches!(
                words.get(1).copied(),
                Some("status" | "diff" | "log" | "show" | "rev-parse" | "ls-files" | "blame")
            ),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_classified_cautiously() {
        for c in [
            "ls -la",
            "cat a.txt | grep x",
            "git status && git diff",
            "find . -name '*.rs'",
        ] {
            assert_eq!(classify_command(c), ToolClass::Read, "{c}");
        }
        for c in [
            "echo x >> log.txt",
            "python3 test.py",
            "find . -delete",
            "sed -i s/a/b/ f",
            "git commit -m x",
            "cat $(rm -rf x)",
            "",
        ] {
            assert_eq!(classify_command(c), ToolClass::Mutate, "{c}");
        }
        for c in [
            "git push origin main",
            "curl -X POST https://x",
            "cd x && npm publish",
            "ls; wget http://x",
        ] {
            assert_eq!(classify_command(c), ToolClass::External, "{c}");
        }
        assert_eq!(classify("edit", &serde_json::json!({})), ToolClass::Mutate);
        assert_eq!(classify("grep", &serde_json::json!({})), ToolClass::Read);
    }
}
