//! A bound on how long a future may take, on the current glommio executor.

use std::time::Duration;

/// `f`'s output, or None once `d` has passed.
pub async fn within<T>(d: Duration, f: impl std::future::Future<Output = T>) -> Option<T> {
    match futures_util::future::select(std::pin::pin!(f), std::pin::pin!(glommio::timer::sleep(d)))
        .await
    {
        futures_util::future::Either::Left((v, _)) => Some(v),
        futures_util::future::Either::Right(_) => None,
    }
}
