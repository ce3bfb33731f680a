//! Where rules come from: the policy file, and extra ("aux") rules from
//! other sources placed ahead of the file's, as foxpass's divvy fork read
//! them from ZooKeeper ([`zookeeper`]). Every source feeds the same install
//! path: the file's rules and the aux rules are combined and validated as
//! one policy, and a combination that does not validate changes nothing.

pub mod zookeeper;

use std::sync::{Arc, Mutex};

use crate::config::schema::RawRule;
use crate::config::validate::with_aux_rules;
use crate::config::Policy;
use crate::limiter::Limiter;
use crate::metrics::metrics;
use crate::rules::RuleSet;

/// The rules of every source, and the limiter they are installed in.
pub struct RuleSources {
    limiter: Arc<Limiter>,
    state: Mutex<State>,
}

struct State {
    file: Policy,
    aux: Vec<RawRule>,
}

impl RuleSources {
    /// Sources with the file's `policy` in force and no aux rules yet.
    pub fn new(limiter: Arc<Limiter>, policy: Policy) -> RuleSources {
        RuleSources {
            limiter,
            state: Mutex::new(State {
                file: policy,
                aux: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs a new file policy with the aux rules in force; returns the
    /// number of rules, or why nothing changed.
    pub fn install_file(&self, policy: Policy) -> Result<usize, String> {
        let mut state = self.lock();
        let combined = combine(&state.aux, &policy)?;
        let n = combined.rules.len();
        self.limiter.install(RuleSet::new(combined));
        state.file = policy;
        Ok(n)
    }

    /// Installs new aux rules ahead of the file's; returns the number of
    /// rules, or why nothing changed (the previous aux rules stay).
    pub fn install_aux(&self, aux: Vec<RawRule>) -> Result<usize, String> {
        let mut state = self.lock();
        let combined = combine(&aux, &state.file)?;
        let n = combined.rules.len();
        self.limiter.install(RuleSet::new(combined));
        metrics()
            .aux_rules
            .set(i64::try_from(aux.len()).unwrap_or(i64::MAX));
        state.aux = aux;
        Ok(n)
    }

    /// The aux rules in force.
    pub fn aux_count(&self) -> usize {
        self.lock().aux.len()
    }

    /// The file policy in force (without aux rules).
    pub fn file_policy(&self) -> Policy {
        self.lock().file.clone()
    }
}

fn combine(aux: &[RawRule], file: &Policy) -> Result<Policy, String> {
    if aux.is_empty() {
        return Ok(file.clone());
    }
    with_aux_rules(aux, file).map_err(|problems| {
        problems
            .iter()
            .map(|p| format!("{}: {p}", file.source))
            .collect::<Vec<_>>()
            .join("; ")
    })
}
