//! Where rules come from: the policy file ([`mod@file`]), extra ("aux") rules
//! placed ahead of the file's, as foxpass's divvy fork read them from
//! ZooKeeper ([`zookeeper`]), and envoyproxy/ratelimit domains from an xDS
//! control plane ([`xds`]). Every source feeds the same install path: the
//! sources are combined and validated as one policy, and a combination that
//! does not validate changes nothing.

pub mod file;
pub mod xds;
pub mod zookeeper;

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::config::envoy_ratelimit::EnvoyConfig;
use crate::config::schema::RawRule;
use crate::config::validate::with_aux_rules;
use crate::config::Policy;
use crate::limiter::Limiter;
use crate::observe::telemetry::Telemetry;
use crate::rules::RuleSet;

/// The rules of every source, and the limiter they are installed in.
pub struct RuleSources {
    limiter: Arc<Limiter>,
    state: Mutex<State>,
}

struct State {
    file: Policy,
    aux: Vec<RawRule>,
    /// envoyproxy/ratelimit domains from xDS, added to the file's.
    xds: Vec<Arc<EnvoyConfig>>,
    /// Whether an xDS update was ever installed.
    xds_loaded: bool,
    /// The latest aux rules when they were refused (they did not fit the
    /// file): tried again with each new file.
    refused: Option<Vec<RawRule>>,
}

impl RuleSources {
    /// Sources with the file's `policy` in force and no aux rules yet.
    pub fn new(limiter: Arc<Limiter>, policy: Policy) -> RuleSources {
        RuleSources {
            limiter,
            state: Mutex::new(State {
                file: policy,
                aux: Vec::new(),
                xds: Vec::new(),
                xds_loaded: false,
                refused: None,
            }),
        }
    }

    /// Where the sources record (the limiter's registry: the service's, which
    /// its `/metrics` serves).
    pub fn telemetry(&self) -> &Telemetry {
        self.limiter.telemetry()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs a new file policy with the aux rules in force; returns the
    /// number of rules, or why nothing changed.
    ///
    /// Aux rules refused earlier because they did not fit the file are the
    /// source's latest: they are tried first, and installed if the new file
    /// fits them.
    pub fn install_file(&self, policy: Policy) -> Result<usize, String> {
        let mut state = self.lock();
        if let Some(latest) = state.refused.take() {
            match combine(&latest, &policy, &state.xds, state.xds_loaded) {
                Ok(combined) => {
                    let n = combined.rules.len();
                    self.limiter.install(RuleSet::new(combined));
                    tracing::info!(
                        aux_rules = latest.len(),
                        "aux rules refused earlier fit the new policy file; installed"
                    );
                    self.set_aux_gauge(latest.len());
                    state.aux = latest;
                    state.file = policy;
                    return Ok(n);
                }
                Err(_) => state.refused = Some(latest),
            }
        }
        let combined = combine(&state.aux, &policy, &state.xds, state.xds_loaded)?;
        let n = combined.rules.len();
        self.limiter.install(RuleSet::new(combined));
        state.file = policy;
        Ok(n)
    }

    /// Installs new aux rules ahead of the file's; returns the number of
    /// rules, or why nothing changed (the previous aux rules stay).
    pub fn install_aux(&self, aux: Vec<RawRule>) -> Result<usize, String> {
        let mut state = self.lock();
        let combined = match combine(&aux, &state.file, &state.xds, state.xds_loaded) {
            Ok(c) => c,
            Err(e) => {
                state.refused = Some(aux);
                return Err(e);
            }
        };
        let n = combined.rules.len();
        self.limiter.install(RuleSet::new(combined));
        self.set_aux_gauge(aux.len());
        state.aux = aux;
        state.refused = None;
        Ok(n)
    }
}

impl RuleSources {
    /// Installs the domains an xDS control plane sent (its whole state: they
    /// replace the previous update's); returns the number of domains, or why
    /// nothing changed (a domain the file also defines, or defined twice).
    pub fn install_xds(&self, domains: Vec<Arc<EnvoyConfig>>) -> Result<usize, String> {
        let mut state = self.lock();
        let combined = combine(&state.aux, &state.file, &domains, true)?;
        let n = domains.len();
        self.limiter.install(RuleSet::new(combined));
        self.limiter.set_xds_pending(false);
        state.xds = domains;
        state.xds_loaded = true;
        Ok(n)
    }

    fn set_aux_gauge(&self, n: usize) {
        self.telemetry()
            .metrics
            .sources
            .aux_rules
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// The file's policy with the aux rules ahead and the xDS domains added; a
/// policy without a source (no file) takes `xds` as its source once an xDS
/// update was installed (`xds_loaded`): it is then configured.
fn combine(
    aux: &[RawRule],
    file: &Policy,
    xds: &[Arc<EnvoyConfig>],
    xds_loaded: bool,
) -> Result<Policy, String> {
    let mut combined = if aux.is_empty() {
        file.clone()
    } else {
        with_aux_rules(aux, file).map_err(|problems| {
            format!(
                "aux rules ahead of {}: {}",
                file.source,
                problems.join("; ")
            )
        })?
    };
    for domain in xds {
        if let Some(first) = combined.envoy.iter().find(|c| c.domain == domain.domain) {
            return Err(format!(
                "duplicate domain '{}' in {} (already defined by {})",
                domain.domain, domain.file, first.file
            ));
        }
        combined.envoy.push(Arc::clone(domain));
    }
    if combined.source.is_empty() && xds_loaded {
        combined.source = "xds".to_owned();
    }
    Ok(combined)
}

/// SHA-256 of `bytes`, in hex: what identifies a policy or aux rule set.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
