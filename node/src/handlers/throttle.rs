//! Charging a request to its client's quota (`crate::quota` holds the
//! budgets and the mute): used by the handlers and the server, above the
//! per-core state.

use skiff_security::quota::QuotaKey;

use crate::quota::now_ms;

/// Charges a request's usage for its session (`amount` is only worked out
/// when some quota is set): the throttle in ms (clamped to
/// an i32 for `throttle_time_ms`), the connection muted that long.
pub fn charge(
    core: &crate::state::CoreState,
    session: &crate::security::Session,
    client_id: &str,
    key: QuotaKey,
    amount: impl FnOnce() -> f64,
) -> i32 {
    let table = core.topics();
    let quotas = &table.security.quotas;
    if quotas.is_empty() {
        return 0;
    }
    let throttle = core.node.quota_budgets.charge(
        quotas,
        &session.principal.name,
        client_id,
        key,
        amount(),
        now_ms(),
    );
    if throttle > 0 {
        core.metrics.throttled(key);
    }
    session.mute.extend(throttle);
    i32::try_from(throttle).unwrap_or(i32::MAX)
}
