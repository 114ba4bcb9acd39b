//! Running a model to the end of its state space (or to the discoveries it is expected to make)
//! and printing a discovery as a step-by-step trace.

use std::collections::BTreeMap;
use std::fmt::{Debug, Display, Write};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

/// How far the models are explored. `Small` keeps `cargo test` quick at the test profile's
/// opt-level 1; `Large` adds workers, grants and time, for a release build run by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Small,
    Large,
}

impl Bound {
    /// Environment variable read by the tests: `TOLLGATE_MODEL_BOUND=large`.
    pub const ENV: &'static str = "TOLLGATE_MODEL_BOUND";

    /// The bound named by `TOLLGATE_MODEL_BOUND` (`small`, the default, or `large`).
    ///
    /// # Panics
    /// On any other value: a mistyped bound must not silently check the small one.
    pub fn from_env() -> Bound {
        match std::env::var(Self::ENV) {
            Err(_) => Bound::Small,
            Ok(value) => Bound::parse(&value).unwrap_or_else(|| {
                panic!("{} must be `small` or `large`, not {value:?}", Self::ENV)
            }),
        }
    }

    pub fn parse(text: &str) -> Option<Bound> {
        match text {
            "" | "small" => Some(Bound::Small),
            "large" => Some(Bound::Large),
            _ => None,
        }
    }

    pub fn is_large(self) -> bool {
        self == Bound::Large
    }
}

/// What one exploration found, and what it cost.
#[derive(Debug)]
pub struct Outcome<State, Action> {
    /// Distinct states reached (fingerprints).
    pub unique_states: usize,
    /// States generated, repeats included.
    pub generated_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Property name to the path that discovered it: a counterexample for `always`, an example
    /// for `sometimes`.
    pub discoveries: BTreeMap<&'static str, Path<State, Action>>,
}

impl<State, Action> Outcome<State, Action> {
    pub fn found(&self, property: &str) -> bool {
        self.discoveries.contains_key(property)
    }

    /// One line for a test's output, and the counts `docs/lab.md` lists.
    pub fn summary(&self, name: &str) -> String {
        format!(
            "{name}: {} unique states ({} generated), depth {}, {:.2?}, discoveries {:?}",
            self.unique_states,
            self.generated_states,
            self.max_depth,
            self.elapsed,
            self.discoveries.keys().collect::<Vec<_>>()
        )
    }

    /// Print the summary and the counterexample to each of `failures` found, and, at the small
    /// bound, check that `small_states` states were reached: a changed count means the model
    /// (or the state it runs over) changed.
    pub fn report(&self, name: &str, failures: &[&str], small_states: usize)
    where
        State: Clone + Display,
        Action: Clone + Display,
    {
        println!("{}", self.summary(name));
        for failure in failures {
            if let Some(path) = self.discoveries.get(failure) {
                println!("{name}: counterexample to {failure:?}:\n{}", trace(path));
            }
        }
        if !Bound::from_env().is_large() {
            assert_eq!(
                self.unique_states, small_states,
                "{name}: the state count changed, so the model (or the state it runs over) \
                 did; if that was meant, update the count here and in docs/lab.md"
            );
        }
    }
}

/// Explore `model` breadth first.
///
/// With no `expected_failures` the whole reachable state space is explored (the checker stops
/// early only if every property has a discovery), so the state count does not depend on the
/// number of threads.
///
/// With expected failures, the search deepens one step at a time (on one thread, so every run
/// is the same) until all of them are found or the state space is exhausted: the first depth
/// that reaches a failure gives a shortest counterexample, where a single unbounded run would
/// report whichever violating state it met last. The state count is that of the last, deepest
/// run; `elapsed` covers all of them.
pub fn run<M>(model: M, expected_failures: &[&'static str]) -> Outcome<M::State, M::Action>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq,
{
    let started = Instant::now();
    if expected_failures.is_empty() {
        let threads = std::thread::available_parallelism().map_or(1, |count| count.get());
        let checker = model.checker().threads(threads).spawn_bfs().join();
        return Outcome {
            unique_states: checker.unique_state_count(),
            generated_states: checker.state_count(),
            max_depth: checker.max_depth(),
            elapsed: started.elapsed(),
            discoveries: checker.discoveries().into_iter().collect(),
        };
    }
    // Depth 1 is the initial states; a run bounded at depth `d` checks paths of `d - 1` steps.
    let mut depth_max = 2;
    loop {
        let checker = model
            .clone()
            .checker()
            .finish_when(HasDiscoveries::AllOf(
                expected_failures.iter().copied().collect(),
            ))
            .target_max_depth(depth_max)
            .threads(1)
            .spawn_bfs()
            .join();
        let discoveries: BTreeMap<_, _> = checker.discoveries().into_iter().collect();
        let all_found = expected_failures
            .iter()
            .all(|name| discoveries.contains_key(name));
        // A run that met no state at its depth bound has seen every reachable state.
        let exhausted = checker.max_depth() < depth_max;
        if all_found || exhausted {
            return Outcome {
                unique_states: checker.unique_state_count(),
                generated_states: checker.state_count(),
                max_depth: checker.max_depth(),
                elapsed: started.elapsed(),
                discoveries,
            };
        }
        depth_max += 1;
    }
}

/// A discovery as numbered steps: each action, then the state it led to.
pub fn trace<State, Action>(path: &Path<State, Action>) -> String
where
    State: Clone + Display,
    Action: Clone + Display,
{
    let mut text = String::new();
    let steps = path.clone().into_vec();
    let mut previous_action: Option<Action> = None;
    for (index, (state, action)) in steps.into_iter().enumerate() {
        // A step's action is stored with the state it leaves, so print it with the next state.
        let state = state.to_string().replace('\n', "\n      ");
        let _ = match previous_action.take() {
            None => writeln!(text, "  {index:>2}. initial state\n      {state}"),
            Some(taken) => writeln!(text, "  {index:>2}. {taken}\n      {state}"),
        };
        previous_action = action;
    }
    text
}
