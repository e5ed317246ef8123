//! Forking a session at any recorded position: the child's history is the parent's
//! up to there (shared by the world, not copied) and its workspace is the snapshot
//! recorded there (named by content in the log, materialized when the child is first
//! driven). Neither the history's length nor the workspace's size is paid at the fork.

use steadfast_log::{Event, Explorer, Record};
use steadfast_world::{Fork, SessionSummary, World};

use crate::harness::{parse_model, Harness};
use crate::workspace::new_workspace_id;
use crate::{Error, Result};

/// The most children one fork request makes.
pub const MAX_FORKS: u32 = 32;

/// What to fork, and how the children differ from the parent.
#[derive(Debug, Clone, Default)]
pub struct ForkRequest {
    /// The session to fork.
    pub parent: String,
    /// The parent's last position the children share; `None` for its latest
    /// committed one (a running parent is not disturbed).
    pub at: Option<u64>,
    /// How many children (1 to [`MAX_FORKS`]).
    pub count: u32,
    /// Who owns the children.
    pub owner: String,
    /// The children's title; `None` keeps the parent's.
    pub title: Option<String>,
    /// The model the children speak to (`provider/model`); `None` keeps the parent's.
    pub model: Option<String>,
    /// Bounds for the children: each field set replaces the parent's (the caller
    /// has checked them against the operator's ceilings).
    pub limits: Option<steadfast_log::Limits>,
    /// The agent the children run and the CLI it stands for (`package@version`),
    /// when not the parent's (a replay against another CLI; the caller has checked
    /// that it is installed).
    pub agent: Option<(steadfast_log::Agent, String)>,
    /// The instructions the children's wrapped CLI is given, when not the parent's
    /// (`""`: none; a replay against another prompt).
    pub instructions: Option<String>,
    /// Kept from workers: the children are listed idle whatever their log says, so
    /// only the caller drives them (a replay runs its fork's turn itself, through a
    /// gateway that never asks the provider; a worker would run it live).
    pub held: bool,
    /// Explorers of the parent's pending `explore` call (its id) on these tasks, one
    /// child per task (`count` is ignored): each child's id is derived from the call
    /// and its task, so making them again after a crash makes the same ones.
    pub explorer: Option<(String, Vec<String>)>,
}

/// Refuses a position a rewind set aside (the state there is an earlier one's):
/// those records are read through the branch the rewind made.
pub(crate) fn set_aside(session: &str, field: &str, at: u64, folded_to: u64) -> Result<()> {
    if folded_to != at {
        return Err(Error::Invalid(format!(
            "{field}: position {at} of session {session} was set aside by a rewind; \
             use the branch that rewind made (its `rewound` event names it)"
        )));
    }
    Ok(())
}

/// The signal a session in `state` waits for, as the world's row keeps it.
pub(crate) fn awaited(state: &steadfast_log::SessionState) -> Option<String> {
    state.waiting().map(|w| w.name.clone())
}

impl<W: World + Clone, S: steadfast_sandbox::Sandbox> Harness<W, S> {
    /// Makes `request.count` forks of `request.parent` at `request.at`. Each is whole
    /// or absent: a crash between two leaves the ones made so far. A fork inside a
    /// turn is `running` (a worker carries the turn on, resolving the calls cut off at
    /// the fork point as a wake would); a fork of an ended session is `idle`.
    pub async fn fork(&self, request: &ForkRequest) -> Result<Vec<SessionSummary>> {
        if request.explorer.is_none() && !(1..=MAX_FORKS).contains(&request.count) {
            return Err(Error::Invalid(format!(
                "count: between 1 and {MAX_FORKS} forks at once, not {}",
                request.count
            )));
        }
        let (at, state) = fork_point(&self.world, &self.blobs, request).await?;
        let model = match &request.model {
            Some(model) => {
                self.check_agent_model(&state.agent, model)?;
                Some(parse_model(model)?)
            }
            None => None,
        };
        let limits = request.limits.as_ref().map(|asked| steadfast_log::Limits {
            max_cost_micro_usd: asked.max_cost_micro_usd.or(state.limits.max_cost_micro_usd),
            max_tokens: asked.max_tokens.or(state.limits.max_tokens),
            max_turns: asked.max_turns.or(state.limits.max_turns),
            max_duration_ms: asked.max_duration_ms.or(state.limits.max_duration_ms),
        });
        if let (Some(limits), Some(model)) = (&limits, model.as_ref().or(Some(&state.model))) {
            if limits.max_cost_micro_usd.is_some() && !self.is_priced(model) {
                return Err(Error::Invalid(format!(
                    "budget: the model {model} has no price here, so a money bound could never trip"
                )));
            }
        }
        make_forks(&self.world, request, at, &state, model, limits).await
    }
}

/// Where `request` forks its parent, and the parent's state there.
async fn fork_point<W: World>(
    world: &W,
    blobs: &steadfast_world::Blobs,
    request: &ForkRequest,
) -> Result<(u64, steadfast_log::SessionState)> {
    let parent = world.session(&request.parent).await?;
    let at = request.at.unwrap_or(parent.last_seq);
    if at == 0 || at > parent.last_seq {
        return Err(Error::Invalid(format!(
            "at: session {} has records 1 to {}; cannot fork at {at}",
            request.parent, parent.last_seq
        )));
    }
    let (state, _) = steadfast_world::load_state_at(world, blobs, &request.parent, at).await?;
    set_aside(&request.parent, "at", at, state.last_seq)?;
    Ok((at, state))
}

/// Makes the explorers of `parent`'s `explore` call `call_id` on `tasks`, forked at
/// `at` (where the call is due), owned by `owner`; their ids. Made again after a
/// crash, they are the same sessions.
pub(crate) async fn fork_explorers<W: World>(
    world: &W,
    blobs: &steadfast_world::Blobs,
    parent: &str,
    owner: &str,
    call_id: &str,
    tasks: Vec<String>,
    at: u64,
) -> Result<Vec<String>> {
    let request = ForkRequest {
        parent: parent.to_string(),
        at: Some(at),
        owner: owner.to_string(),
        explorer: Some((call_id.to_string(), tasks)),
        ..Default::default()
    };
    let (at, state) = fork_point(world, blobs, &request).await?;
    // The explorers share what the parent has left; their spend comes back to it.
    let n = request.explorer.as_ref().map_or(1, |e| e.1.len() as u32);
    let made = make_forks(
        world,
        &request,
        at,
        &state,
        None,
        Some(state.explorer_limits(n)),
    )
    .await?;
    Ok(made.into_iter().map(|s| s.id).collect())
}

/// Makes the forks `request` asks for at `at`, whose state is `state`, with `model`
/// and `limits` (checked by the caller) if given.
async fn make_forks<W: World>(
    world: &W,
    request: &ForkRequest,
    at: u64,
    state: &steadfast_log::SessionState,
    model: Option<steadfast_log::ModelSpec>,
    limits: Option<steadfast_log::Limits>,
) -> Result<Vec<SessionSummary>> {
    let count = match &request.explorer {
        Some((_, tasks)) => tasks.len() as u32,
        None => request.count,
    };
    let mut children = Vec::with_capacity(count as usize);
    for index in 0..count {
        let explorer = request.explorer.as_ref().map(|(call_id, tasks)| Explorer {
            parent: request.parent.clone(),
            call_id: call_id.clone(),
            index,
            of: tasks.len() as u32,
            task: tasks[index as usize].clone(),
            turn: state.turn,
            spent_before: (state.cost_micro_usd, state.tokens_used()),
        });
        let event = Event::Forked {
            parent: request.parent.clone(),
            at,
            workspace: new_workspace_id(),
            model: model.clone(),
            limits,
            agent: request.agent.clone(),
            instructions: request.instructions.clone(),
            explorer: explorer.clone(),
        };
        let mut child = state.clone();
        child
            .apply(&Record {
                seq: at + 1,
                epoch: 0,
                at_ms: 0,
                event: event.clone(),
            })
            .map_err(|e| Error::Invalid(format!("at: cannot fork there: {e}")))?;
        let waiting_for = awaited(&child);
        let child_id = match &explorer {
            Some(e) => crate::explore::explorer_id(&e.parent, &e.call_id, e.index),
            None => format!("ses_{}", uuid::Uuid::now_v7().simple()),
        };
        let title = match &explorer {
            Some(e) => Some(format!(
                "explorer {} of {}: {}",
                e.index + 1,
                e.parent,
                e.task.chars().take(80).collect::<String>()
            )),
            None => request.title.clone(),
        };
        let fork = Fork {
            parent: request.parent.clone(),
            child: child_id.clone(),
            owner: request.owner.clone(),
            at,
            event,
            status: match request.held {
                true => steadfast_log::Status::Idle,
                false => child.phase.status(),
            },
            waiting_for,
            title,
        };
        match world.fork_session(&fork).await {
            Ok(made) => children.push(made),
            // An explorer made before a crash: the same one.
            Err(steadfast_world::Error::AlreadyExists(_)) if explorer.is_some() => {
                children.push(world.session(&child_id).await?);
            }
            Err(e) => return Err(e.into()),
        }
        steadfast_fault::point(steadfast_fault::points::FORK_MADE);
    }
    Ok(children)
}
