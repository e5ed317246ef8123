//! When the open turns, steps and tool calls of the sessions this process appends to
//! began (log times, so a duration is what the log says), to time them when they end.
//! Bounded: past [`LIMIT`] open entries the oldest-begun are forgotten (their end is
//! then counted but not timed), so sessions that vanish mid-turn leak nothing.

use std::collections::HashMap;

use steadfast_log::ToolClass;

/// Open entries kept, of each kind.
const LIMIT: usize = 10_000;

#[derive(Default)]
pub(crate) struct Timings {
    /// When each open turn began, and its number.
    turns: HashMap<String, (u64, u32)>,
    steps: HashMap<String, u64>,
    tools: HashMap<(String, String), (ToolClass, u64)>,
}

/// Inserts, first forgetting the oldest-begun entries if the map is full.
fn bounded_insert<K: Eq + std::hash::Hash + Clone, V>(
    map: &mut HashMap<K, V>,
    key: K,
    value: V,
    began: impl Fn(&V) -> u64,
) {
    if map.len() >= LIMIT && !map.contains_key(&key) {
        let mut ages: Vec<u64> = map.values().map(&began).collect();
        ages.sort_unstable();
        let cut = ages[LIMIT / 10];
        map.retain(|_, v| began(v) > cut);
    }
    map.insert(key, value);
}

impl Timings {
    pub(crate) fn turn_began(&mut self, session: &str, turn: u32, at: u64) {
        bounded_insert(&mut self.turns, session.to_string(), (at, turn), |v| v.0);
        self.steps.remove(session);
    }

    /// A turn taken up mid-way: its beginning, unless this process saw it already.
    pub(crate) fn turn_resumed(&mut self, session: &str, turn: u32, at: u64) {
        if self.turns.get(session).is_none_or(|(_, t)| *t != turn) {
            bounded_insert(&mut self.turns, session.to_string(), (at, turn), |v| v.0);
        }
    }

    /// A model call's intent: the step before it (if one was open) ends; returns its
    /// length in ms.
    pub(crate) fn step_began(&mut self, session: &str, at: u64) -> Option<u64> {
        let ended = self
            .steps
            .remove(session)
            .map(|from| at.saturating_sub(from));
        bounded_insert(&mut self.steps, session.to_string(), at, |v| *v);
        ended
    }

    /// When the turn began and its number, and its last step's length in ms, where
    /// their beginnings are known.
    pub(crate) fn turn_ended(
        &mut self,
        session: &str,
        at: u64,
    ) -> (Option<(u64, u32)>, Option<u64>) {
        let turn = self.turns.remove(session);
        let step = self
            .steps
            .remove(session)
            .map(|from| at.saturating_sub(from));
        (turn, step)
    }

    pub(crate) fn tool_began(&mut self, session: &str, call: &str, class: ToolClass, at: u64) {
        let key = (session.to_string(), call.to_string());
        bounded_insert(&mut self.tools, key, (class, at), |v| v.1);
    }

    pub(crate) fn tool_ended(&mut self, session: &str, call: &str) -> Option<(ToolClass, u64)> {
        self.tools.remove(&(session.to_string(), call.to_string()))
    }

    pub(crate) fn forget(&mut self, session: &str) {
        self.turns.remove(session);
        self.steps.remove(session);
        self.tools.retain(|(s, _), _| s != session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_run_from_one_model_call_to_the_next_and_the_last_to_the_turn_s_end() {
        let mut t = Timings::default();
        t.turn_began("s", 1, 1_000);
        assert_eq!(t.step_began("s", 1_010), None);
        assert_eq!(t.step_began("s", 1_500), Some(490));
        assert_eq!(t.turn_ended("s", 1_700), (Some((1_000, 1)), Some(200)));
        assert_eq!(t.turn_ended("s", 1_800), (None, None));
    }

    #[test]
    fn open_entries_are_bounded() {
        let mut t = Timings::default();
        for i in 0..(LIMIT as u64 * 3) {
            t.tool_began("s", &format!("call-{i}"), ToolClass::Read, i);
        }
        assert!(t.tools.len() <= LIMIT);
        // The newest are kept.
        let last = format!("call-{}", LIMIT * 3 - 1);
        assert!(t.tool_ended("s", &last).is_some());
    }
}
