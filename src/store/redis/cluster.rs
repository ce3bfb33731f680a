//! Hash slots (a Cluster's), a script call's answers and a slot's charges.

use super::*;

/// The one hash slot of every op (0 outside a Cluster), or `None` when a
/// Cluster request's counters lie in several.
pub(super) fn one_slot(ops: &[CounterOp], cluster: bool) -> Option<u16> {
    if !cluster {
        return Some(0);
    }
    let slot = fred::util::redis_keyslot(ops.first()?.key.as_bytes());
    ops[1..]
        .iter()
        .all(|op| fred::util::redis_keyslot(op.key.as_bytes()) == slot)
        .then_some(slot)
}

/// The indexes of `ops` by hash slot, in order: ops on one key share a
/// slot, so their order is kept.
pub(super) fn by_slot(ops: &[CounterOp]) -> BTreeMap<u16, Vec<usize>> {
    let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        slots
            .entry(fred::util::redis_keyslot(op.key.as_bytes()))
            .or_default()
            .push(i);
    }
    slots
}

/// One counter's answer from the script's two values: the credits left `r`
/// if allowed, else `-1 - r`; and the ms until it resets.
pub(super) fn counter_state(credits: i64, reset_ms: i64) -> CounterState {
    let (allowed, remaining) = if credits >= 0 {
        (true, credits)
    } else {
        (false, -1 - credits)
    };
    CounterState {
        allowed,
        remaining: u64::try_from(remaining).unwrap_or(0),
        reset_after: Duration::from_millis(u64::try_from(reset_ms).unwrap_or(0)),
        overdrawn: 0,
    }
}

/// The counter script's answer for `count` counters (its integers, read by
/// [`super::answer::integers`]): 2 values per counter
/// ([`counter_state`]), then 2 per op charged past what was left (its
/// 1-based index and those credits).
pub(super) fn parse_answer(raw: &[i64], count: usize) -> Result<Vec<CounterState>, StoreError> {
    let malformed = || {
        StoreError::Refused(format!(
            "redis: the counter script returned {} values for {} counters",
            raw.len(),
            count
        ))
    };
    if raw.len() < count * 2 || !raw.len().is_multiple_of(2) {
        return Err(malformed());
    }
    let (pairs, past) = raw.split_at(count * 2);
    let mut states: Vec<CounterState> = pairs
        .chunks_exact(2)
        .map(|c| counter_state(c[0], c[1]))
        .collect();
    for p in past.chunks_exact(2) {
        let i = usize::try_from(p[0] - 1).map_err(|_| malformed())?;
        let state = states.get_mut(i).ok_or_else(malformed)?;
        state.overdrawn = u64::try_from(p[1]).map_err(|_| malformed())?;
    }
    Ok(states)
}

/// Hands one request's counters (all in hash slot `slot`) to the batcher
/// and waits for their answers.
pub(super) async fn batched(
    batcher: &mpsc::Sender<Pending>,
    ops: &[CounterOp],
    charge: Charge,
    slot: u16,
) -> Result<Vec<CounterState>, StoreError> {
    let (reply, answer) = oneshot::channel();
    batcher
        .send(Pending {
            ops: ops.to_vec(),
            charge,
            reply,
            slot,
            trace: crate::observe::tracing_otlp::current(),
        })
        .await
        .map_err(|_| StoreError::Unavailable("redis: the batcher stopped".into()))?;
    // The batch's script call carries the command timeout, so an answer
    // always comes (a caller with a deadline of its own stops waiting
    // earlier: see failover.rs).
    answer.await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(
            "redis: the batch was dropped".into(),
        ))
    })
}

/// A Cluster request in a task of its own: a caller that stops waiting (its
/// deadline passed) must not cut it off between charging the slots and
/// giving back what another slot denied.
pub(super) async fn cluster_call(
    core: Arc<Core>,
    ops: &[CounterOp],
    charge: Charge,
) -> Result<Vec<CounterState>, StoreError> {
    let ops = ops.to_vec();
    tokio::spawn(async move { core.apply_cluster(&ops, charge).await })
        .await
        .unwrap_or_else(|e| Err(StoreError::Unavailable(format!("redis: cluster call: {e}"))))
}

/// Which ops of one script call were charged: a charging op (cost > 0, not a
/// refund) whose group was allowed in full, in a request not blocked there;
/// and a denied overdraft op alone in its group here but not in the request
/// (`split[i]`), which the script charged as an op on its own: it is given
/// back with the rest of its group (a denied group takes no debt).
pub(super) fn charged_in_slot(
    part: &[CounterOp],
    got: &[CounterState],
    charge: Charge,
    split: &[bool],
) -> Vec<bool> {
    let mut group_ok = Vec::with_capacity(part.len());
    let mut start = 0;
    while start < part.len() {
        let mut end = start + 1;
        while end < part.len() && part[end].joint {
            end += 1;
        }
        let ok = got[start..end].iter().all(|s| s.allowed);
        group_ok.extend(std::iter::repeat_n(ok, end - start));
        start = end;
    }
    let blocked = charge == Charge::Denied
        || (charge == Charge::AllOrNothing
            && part.iter().zip(&group_ok).any(|(op, ok)| op.decides && !ok));
    part.iter()
        .zip(group_ok)
        .enumerate()
        .map(|(i, (op, ok))| {
            let alone = !op.joint && part.get(i + 1).is_none_or(|next| !next.joint);
            let overdrawn = op.overdraft && split[i] && alone && charge == Charge::Each;
            ((ok && !blocked) || (overdrawn && !got[i].allowed)) && op.cost > 0 && !op.refund
        })
        .collect()
}
