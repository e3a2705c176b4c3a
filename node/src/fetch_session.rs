//! KIP-227 incremental fetch sessions, both ends, as rules with no I/O.
//!
//! A fetcher that reads the same partitions over and over (a follower, a
//! consumer of thousands of partitions) names them all once; the leader keeps
//! them in a session, and from then on a request carries only the partitions
//! whose fetch position changed (and those to forget), and a response only the
//! partitions with something new: records, a moved high watermark or log
//! start, an error, a diverging epoch.
//!
//! ```text
//! session id  epoch  request                               response
//! 0           -1     full, no session (before KIP-227)     every partition, session 0
//! 0            0     full, make a session of it            every partition, new id (0: no room)
//! id           0     close id; full, make a new session    every partition, new id
//! id          -1     close id; full, no session            every partition, session 0
//! id          n > 0  incremental on id (n: its next epoch) what changed, session id
//!                    unknown id: FETCH_SESSION_ID_NOT_FOUND; n not the next
//!                    epoch: INVALID_FETCH_SESSION_EPOCH; either way the
//!                    fetcher starts over with a full request
//! ```
//!
//! [`SessionCache`] is the leader's end, one per core: a session lives on the
//! core whose connection made it, and a fetcher that reconnects to another
//! core gets FETCH_SESSION_ID_NOT_FOUND and starts over, as after an eviction.
//! It holds at most `slots` sessions (`max.incremental.fetch.session.cache.slots`
//! over the cores). A new session takes the place of one idle longer than
//! `min.incremental.fetch.session.eviction.ms`, else of the least valuable one
//! it outranks (Kafka's order: a follower's session over a consumer's, then
//! more partitions over fewer); otherwise it is not made and the fetcher goes
//! on with full requests.
//!
//! [`SessionBuilder`] is the fetcher's end, used by the follower fetchers
//! (`replica::fetcher`): Kafka's `FetchSessionHandler`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use skiff_engine::TopicPartition;

/// No session: a request before KIP-227, or a response that made none.
pub const INVALID_SESSION_ID: i32 = 0;
/// A full request that asks for a new session.
pub const INITIAL_EPOCH: i32 = 0;
/// A full request that asks for no session.
pub const FINAL_EPOCH: i32 = -1;

/// What a fetcher asks of one partition; a session keeps it until it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchParams {
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
    /// The fetcher's log start (a follower's; -1 from consumers).
    pub log_start_offset: i64,
}

/// What the leader answers for a partition, as far as a session compares
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The answer carries record bytes.
    pub records: bool,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub error: bool,
    pub diverging: bool,
}

/// What a fetch request's session fields ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchContext {
    /// Answer every partition of the request; `create`: make a session of
    /// them afterwards ([`SessionCache::create`]).
    Full { create: bool },
    /// Answer only what changed ([`SessionCache::respond`]) among the
    /// session's partitions, read in this order with these parameters.
    Incremental {
        session_id: i32,
        partitions: Vec<(TopicPartition, FetchParams)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("fetch session {0} is not known (evicted, or made on another core or node)")]
    NotFound(i32),
    #[error("fetch session {id}: epoch {got}, but {expected} is next")]
    InvalidEpoch { id: i32, got: i32, expected: i32 },
}

impl SessionError {
    pub fn code(&self) -> ResponseError {
        match self {
            SessionError::NotFound(_) => ResponseError::FetchSessionIdNotFound,
            SessionError::InvalidEpoch { .. } => ResponseError::InvalidFetchSessionEpoch,
        }
    }
}

/// Whether a Fetch's top-level error is about its session: the fetcher starts
/// over with a full request at once (nothing else is wrong).
pub fn is_session_error(code: i16) -> bool {
    code == ResponseError::FetchSessionIdNotFound.code()
        || code == ResponseError::InvalidFetchSessionEpoch.code()
}

/// The epoch after `epoch` (Kafka's `nextEpoch`: it wraps to 1, never to the
/// full-request epochs).
pub fn next_epoch(epoch: i32) -> i32 {
    match epoch {
        e if e < 0 => FINAL_EPOCH,
        i32::MAX => 1,
        e => e + 1,
    }
}

/// One partition as a session holds it: what was asked and what was last
/// answered.
#[derive(Debug, Clone)]
struct Cached {
    /// Its place in the session's order.
    seq: u64,
    params: FetchParams,
    /// -1 after an error, so the partition is named again once it clears.
    high_watermark: i64,
    log_start_offset: i64,
}

#[derive(Debug)]
struct Session {
    next_epoch: i32,
    /// A follower's: only another follower's session may take its place.
    privileged: bool,
    last_used: Instant,
    /// The order partitions are read and answered in (`seq` -> partition):
    /// one that got records moves to the back, so a response's byte budget
    /// starts elsewhere next time.
    order: BTreeMap<u64, TopicPartition>,
    partitions: HashMap<TopicPartition, Cached>,
    next_seq: u64,
}

impl Session {
    fn upsert(&mut self, tp: &TopicPartition, params: FetchParams, answered: Option<Answer>) {
        let (high_watermark, log_start_offset) = match answered {
            Some(a) if !a.error => (a.high_watermark, a.log_start_offset),
            Some(_) => (-1, -1),
            // Added by an incremental request: named in the next response,
            // whatever it holds.
            None => (i64::MIN, i64::MIN),
        };
        match self.partitions.get_mut(tp) {
            // A new position for a partition held: what it was last
            // answered still stands (Kafka's `updateRequestParams`).
            Some(c) => c.params = params,
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.order.insert(seq, tp.clone());
                self.partitions.insert(
                    tp.clone(),
                    Cached {
                        seq,
                        params,
                        high_watermark,
                        log_start_offset,
                    },
                );
            }
        }
    }

    fn remove(&mut self, tp: &TopicPartition) {
        if let Some(c) = self.partitions.remove(tp) {
            self.order.remove(&c.seq);
        }
    }

    fn move_to_back(&mut self, tp: &TopicPartition) {
        if let Some(c) = self.partitions.get_mut(tp) {
            self.order.remove(&c.seq);
            c.seq = self.next_seq;
            self.next_seq += 1;
            self.order.insert(c.seq, tp.clone());
        }
    }
}

/// The leader's sessions on one core.
#[derive(Debug)]
pub struct SessionCache {
    slots: usize,
    evict_after: Duration,
    sessions: HashMap<i32, Session>,
    rng: fastrand::Rng,
    /// Sessions made and sessions evicted since start (metrics).
    pub created: u64,
    pub evicted: u64,
}

impl SessionCache {
    /// At most `slots` sessions (0: none, every fetch is full); a session
    /// idle for `evict_after` gives way to any new one.
    pub fn new(slots: usize, evict_after: Duration) -> SessionCache {
        SessionCache {
            slots,
            evict_after,
            sessions: HashMap::new(),
            rng: fastrand::Rng::new(),
            created: 0,
            evicted: 0,
        }
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Partitions held over every session.
    pub fn partitions(&self) -> usize {
        self.sessions.values().map(|s| s.partitions.len()).sum()
    }

    /// A request's session fields, the partitions it names (`changed`) and
    /// those it forgets: what to answer. A full request closes the session it
    /// names; an incremental one updates the session and moves its epoch on.
    pub fn begin(
        &mut self,
        session_id: i32,
        epoch: i32,
        changed: &[(TopicPartition, FetchParams)],
        forgotten: &[TopicPartition],
        now: Instant,
    ) -> Result<FetchContext, SessionError> {
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            if session_id != INVALID_SESSION_ID {
                self.sessions.remove(&session_id);
            }
            return Ok(FetchContext::Full {
                create: epoch == INITIAL_EPOCH && self.slots > 0,
            });
        }
        let session = self
            .sessions
            .get_mut(&session_id)
            .ok_or(SessionError::NotFound(session_id))?;
        if session.next_epoch != epoch {
            return Err(SessionError::InvalidEpoch {
                id: session_id,
                got: epoch,
                expected: session.next_epoch,
            });
        }
        session.next_epoch = next_epoch(epoch);
        session.last_used = now;
        // Kafka's order: updates, then what is forgotten.
        for (tp, params) in changed {
            session.upsert(tp, *params, None);
        }
        for tp in forgotten {
            session.remove(tp);
        }
        let partitions = session
            .order
            .values()
            .filter_map(|tp| session.partitions.get(tp).map(|c| (tp.clone(), c.params)))
            .collect();
        Ok(FetchContext::Incremental {
            session_id,
            partitions,
        })
    }

    /// After a full fetch that asked for a session: one of its partitions,
    /// remembering what each was answered. Returns the session's id, or
    /// [`INVALID_SESSION_ID`] when there is no room (or nothing to hold).
    pub fn create(
        &mut self,
        privileged: bool,
        partitions: Vec<(TopicPartition, FetchParams, Answer)>,
        now: Instant,
    ) -> i32 {
        if self.slots == 0 || partitions.is_empty() {
            return INVALID_SESSION_ID;
        }
        if self.sessions.len() >= self.slots && !self.evict_one(privileged, partitions.len(), now) {
            return INVALID_SESSION_ID;
        }
        let id = loop {
            let id = self.rng.i32(1..=i32::MAX);
            if !self.sessions.contains_key(&id) {
                break id;
            }
        };
        let mut session = Session {
            next_epoch: 1,
            privileged,
            last_used: now,
            order: BTreeMap::new(),
            partitions: HashMap::with_capacity(partitions.len()),
            next_seq: 0,
        };
        for (tp, params, answer) in partitions {
            session.upsert(&tp, params, Some(answer));
        }
        self.sessions.insert(id, session);
        self.created += 1;
        id
    }

    /// Makes room for a new session of `size` partitions: the least recently
    /// used session if it idled past `evict_after`, else the least valuable
    /// one the new session outranks.
    fn evict_one(&mut self, privileged: bool, size: usize, now: Instant) -> bool {
        let stale = self
            .sessions
            .iter()
            .min_by_key(|(_, s)| s.last_used)
            .filter(|(_, s)| now.saturating_duration_since(s.last_used) >= self.evict_after)
            .map(|(id, _)| *id);
        let victim = stale.or_else(|| {
            self.sessions
                .iter()
                .filter(|(_, s)| privileged || !s.privileged)
                .min_by_key(|(_, s)| (s.privileged, s.partitions.len(), s.last_used))
                .filter(|(_, s)| (s.privileged, s.partitions.len()) < (privileged, size))
                .map(|(id, _)| *id)
        });
        match victim {
            Some(id) => {
                self.sessions.remove(&id);
                self.evicted += 1;
                true
            }
            None => false,
        }
    }

    /// An incremental fetch on `session_id` read `tp` and would answer
    /// `answer`: whether the response names it (records, a high watermark or
    /// log start other than last answered, an error, a diverging epoch).
    /// Remembers what it answers; a partition given records moves to the
    /// back of the session's order.
    pub fn respond(&mut self, session_id: i32, tp: &TopicPartition, answer: Answer) -> bool {
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return true; // closed meanwhile: name everything, as a full answer would
        };
        let Some(c) = session.partitions.get_mut(tp) else {
            return true;
        };
        let mut named = answer.records || answer.diverging;
        if answer.error {
            c.high_watermark = -1;
            c.log_start_offset = -1;
            named = true;
        } else {
            if c.high_watermark != answer.high_watermark {
                c.high_watermark = answer.high_watermark;
                named = true;
            }
            if c.log_start_offset != answer.log_start_offset {
                c.log_start_offset = answer.log_start_offset;
                named = true;
            }
        }
        if answer.records {
            session.move_to_back(tp);
        }
        named
    }
}

/// The next request a fetcher sends on its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextRequest {
    pub session_id: i32,
    pub epoch: i32,
    /// Partitions to name: every one in a full request, else those added or
    /// changed since the last.
    pub send: Vec<(TopicPartition, FetchParams)>,
    /// Partitions the session holds that the fetcher no longer wants.
    pub forget: Vec<TopicPartition>,
}

impl NextRequest {
    pub fn is_full(&self) -> bool {
        self.epoch == INITIAL_EPOCH || self.epoch == FINAL_EPOCH
    }
}

/// The fetcher's end of a session (Kafka's `FetchSessionHandler`): one
/// request in flight at a time, `build` before it, `on_response` or
/// `on_failure` after it.
#[derive(Debug, Default)]
pub struct SessionBuilder {
    session_id: i32,
    next_epoch: i32,
    /// The partitions the leader holds for us, as last named.
    held: BTreeMap<TopicPartition, FetchParams>,
}

impl SessionBuilder {
    /// A builder whose first request is full and asks for a session.
    pub fn new() -> SessionBuilder {
        SessionBuilder::default()
    }

    pub fn session_id(&self) -> i32 {
        self.session_id
    }

    /// The request for `wanted` (every partition the fetcher reads now).
    pub fn build(&mut self, wanted: &BTreeMap<TopicPartition, FetchParams>) -> NextRequest {
        let (send, forget) = if self.next_epoch == INITIAL_EPOCH {
            (
                wanted.iter().map(|(tp, p)| (tp.clone(), *p)).collect(),
                Vec::new(),
            )
        } else {
            let send = wanted
                .iter()
                .filter(|(tp, p)| self.held.get(*tp) != Some(*p))
                .map(|(tp, p)| (tp.clone(), *p))
                .collect();
            let forget = self
                .held
                .keys()
                .filter(|tp| !wanted.contains_key(*tp))
                .cloned()
                .collect();
            (send, forget)
        };
        self.held = wanted.clone();
        NextRequest {
            session_id: self.session_id,
            epoch: self.next_epoch,
            send,
            forget,
        }
    }

    /// The leader answered the request last built with a top-level
    /// `error_code` and `session_id`. Returns false when the answer is an
    /// error (a session error makes the next request full).
    pub fn on_response(&mut self, error_code: i16, session_id: i32) -> bool {
        if error_code != 0 {
            if error_code == ResponseError::FetchSessionIdNotFound.code() {
                self.session_id = INVALID_SESSION_ID;
            }
            // Close what we hold (if anything) and ask for a new one.
            self.next_epoch = INITIAL_EPOCH;
            return false;
        }
        if session_id == INVALID_SESSION_ID {
            // None made (full answer) or closed by the leader (incremental).
            self.session_id = INVALID_SESSION_ID;
            self.next_epoch = INITIAL_EPOCH;
        } else if self.next_epoch == INITIAL_EPOCH {
            self.session_id = session_id;
            self.next_epoch = 1;
        } else {
            self.next_epoch = next_epoch(self.next_epoch);
        }
        true
    }

    /// The request got no answer (connection lost, timed out): the next is
    /// full and closes the session.
    pub fn on_failure(&mut self) {
        self.next_epoch = INITIAL_EPOCH;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    fn params(offset: i64) -> FetchParams {
        FetchParams {
            fetch_offset: offset,
            partition_max_bytes: 1 << 20,
            current_leader_epoch: 0,
            last_fetched_epoch: 0,
            log_start_offset: -1,
        }
    }

    fn answer(hw: i64) -> Answer {
        Answer {
            records: false,
            high_watermark: hw,
            log_start_offset: 0,
            error: false,
            diverging: false,
        }
    }

    fn cache() -> SessionCache {
        SessionCache::new(2, Duration::from_secs(120))
    }

    #[test]
    fn a_full_request_makes_a_session_and_incremental_ones_move_its_epoch() {
        let mut c = cache();
        let now = Instant::now();
        assert_eq!(
            c.begin(0, INITIAL_EPOCH, &[], &[], now),
            Ok(FetchContext::Full { create: true })
        );
        let id = c.create(false, vec![(tp(0), params(5), answer(5))], now);
        assert_ne!(id, INVALID_SESSION_ID);
        let ctx = c.begin(id, 1, &[(tp(1), params(0))], &[], now).unwrap();
        assert_eq!(
            ctx,
            FetchContext::Incremental {
                session_id: id,
                partitions: vec![(tp(0), params(5)), (tp(1), params(0))]
            }
        );
        // The same epoch again, or one ahead: refused, the session kept.
        assert_eq!(
            c.begin(id, 1, &[], &[], now),
            Err(SessionError::InvalidEpoch {
                id,
                got: 1,
                expected: 2
            })
        );
        assert!(matches!(
            c.begin(id, 3, &[], &[], now),
            Err(SessionError::InvalidEpoch { .. })
        ));
        let ctx = c.begin(id, 2, &[], &[tp(0)], now).unwrap();
        assert_eq!(
            ctx,
            FetchContext::Incremental {
                session_id: id,
                partitions: vec![(tp(1), params(0))]
            }
        );
        // An unknown id.
        assert_eq!(
            c.begin(id.wrapping_add(1).max(1), 1, &[], &[], now),
            Err(SessionError::NotFound(id.wrapping_add(1).max(1)))
        );
        // A full request naming the session closes it.
        assert_eq!(
            c.begin(id, FINAL_EPOCH, &[], &[], now),
            Ok(FetchContext::Full { create: false })
        );
        assert_eq!(
            c.begin(id, 3, &[], &[], now),
            Err(SessionError::NotFound(id))
        );
        assert!(c.is_empty());
    }

    #[test]
    fn an_answer_is_named_only_when_something_changed() {
        let mut c = cache();
        let now = Instant::now();
        let id = c.create(
            false,
            vec![(tp(0), params(5), answer(5)), (tp(1), params(0), answer(0))],
            now,
        );
        c.begin(id, 1, &[], &[], now).unwrap();
        assert!(!c.respond(id, &tp(0), answer(5)), "nothing new");
        assert!(c.respond(id, &tp(0), answer(6)), "the high watermark moved");
        assert!(!c.respond(id, &tp(0), answer(6)));
        assert!(c.respond(
            id,
            &tp(0),
            Answer {
                log_start_offset: 3,
                ..answer(6)
            }
        ));
        assert!(c.respond(
            id,
            &tp(0),
            Answer {
                records: true,
                log_start_offset: 3,
                ..answer(6)
            }
        ));
        assert!(c.respond(
            id,
            &tp(0),
            Answer {
                diverging: true,
                log_start_offset: 3,
                ..answer(6)
            }
        ));
        // An error is named, and so is the first answer after it clears.
        assert!(c.respond(
            id,
            &tp(1),
            Answer {
                error: true,
                ..answer(-1)
            }
        ));
        assert!(c.respond(id, &tp(1), answer(0)));
        assert!(!c.respond(id, &tp(1), answer(0)));
        // A partition an incremental request adds is named next time; a new
        // position for one held is not, by itself.
        c.begin(id, 2, &[(tp(2), params(0)), (tp(1), params(1))], &[], now)
            .unwrap();
        assert!(c.respond(id, &tp(2), answer(0)));
        assert!(!c.respond(id, &tp(1), answer(0)));
    }

    #[test]
    fn a_partition_given_records_moves_to_the_back() {
        let mut c = cache();
        let now = Instant::now();
        let parts = (0..3).map(|p| (tp(p), params(0), answer(0))).collect();
        let id = c.create(false, parts, now);
        c.begin(id, 1, &[], &[], now).unwrap();
        c.respond(
            id,
            &tp(0),
            Answer {
                records: true,
                ..answer(1)
            },
        );
        let FetchContext::Incremental { partitions, .. } = c.begin(id, 2, &[], &[], now).unwrap()
        else {
            panic!("incremental expected");
        };
        let order: Vec<i32> = partitions.iter().map(|(t, _)| t.partition).collect();
        assert_eq!(order, vec![1, 2, 0]);
    }

    #[test]
    fn a_full_cache_gives_way_to_stale_then_to_more_valuable_sessions() {
        let mut c = cache();
        let t0 = Instant::now();
        let one = |n: i32| {
            (0..n)
                .map(|p| (tp(p), params(0), answer(0)))
                .collect::<Vec<_>>()
        };
        let small = c.create(false, one(1), t0);
        let big = c.create(false, one(5), t0);
        assert_eq!(c.len(), 2);
        // A consumer's session of 3 outranks the one of 1.
        let mid = c.create(false, one(3), t0);
        assert_ne!(mid, INVALID_SESSION_ID);
        assert!(matches!(
            c.begin(small, 1, &[], &[], t0),
            Err(SessionError::NotFound(_))
        ));
        // One of 2 outranks neither: no session, full fetches go on.
        assert_eq!(c.create(false, one(2), t0), INVALID_SESSION_ID);
        // A follower's outranks any consumer's.
        let follower = c.create(true, one(1), t0);
        assert_ne!(follower, INVALID_SESSION_ID);
        assert_eq!(c.len(), 2);
        // A bigger consumer session takes the place of a smaller consumer's...
        let later = t0 + Duration::from_secs(60);
        let huge = c.create(false, one(100), later);
        assert_ne!(huge, INVALID_SESSION_ID);
        assert!(matches!(
            c.begin(big, 1, &[], &[], later),
            Err(SessionError::NotFound(_))
        ));
        // ...but never a follower's, until that one idles out.
        assert_eq!(c.create(false, one(1), later), INVALID_SESSION_ID);
        assert!(c.begin(follower, 1, &[], &[], later).is_ok());
        let stale = later + Duration::from_secs(121);
        assert!(c.begin(huge, 1, &[], &[], stale).is_ok());
        assert_ne!(c.create(false, one(1), stale), INVALID_SESSION_ID);
        assert!(matches!(
            c.begin(follower, 2, &[], &[], stale),
            Err(SessionError::NotFound(_))
        ));
        assert_eq!(c.evicted, 4);
        let _ = mid;
    }

    #[test]
    fn no_slots_no_sessions() {
        let mut c = SessionCache::new(0, Duration::from_secs(1));
        let now = Instant::now();
        assert_eq!(
            c.begin(0, INITIAL_EPOCH, &[], &[], now),
            Ok(FetchContext::Full { create: false })
        );
        assert_eq!(
            c.create(true, vec![(tp(0), params(0), answer(0))], now),
            INVALID_SESSION_ID
        );
    }

    #[test]
    fn the_epoch_wraps_to_one() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(-1), -1);
    }

    #[test]
    fn the_builder_starts_over_after_errors_and_failures() {
        let mut b = SessionBuilder::new();
        let mut wanted = BTreeMap::new();
        wanted.insert(tp(0), params(0));
        let r = b.build(&wanted);
        assert!(r.is_full());
        assert_eq!((r.session_id, r.send.len()), (0, 1));
        assert!(b.on_response(0, 7));
        let r = b.build(&wanted);
        assert_eq!((r.session_id, r.epoch, r.send.len()), (7, 1, 0));
        assert!(b.on_response(0, 7));
        let r = b.build(&wanted);
        assert_eq!(r.epoch, 2);
        assert!(!b.on_response(ResponseError::InvalidFetchSessionEpoch.code(), 0));
        let r = b.build(&wanted);
        assert_eq!(
            (r.session_id, r.epoch, r.send.len()),
            (7, INITIAL_EPOCH, 1),
            "closes 7, full"
        );
        assert!(!b.on_response(ResponseError::FetchSessionIdNotFound.code(), 0));
        let r = b.build(&wanted);
        assert_eq!((r.session_id, r.epoch), (0, INITIAL_EPOCH));
        assert!(b.on_response(0, 9));
        b.build(&wanted);
        b.on_failure();
        let r = b.build(&wanted);
        assert_eq!((r.session_id, r.epoch, r.send.len()), (9, INITIAL_EPOCH, 1));
        // A full answer that made no session: the next asks again.
        assert!(b.on_response(0, INVALID_SESSION_ID));
        assert_eq!(b.build(&wanted).epoch, INITIAL_EPOCH);
    }

    /// What a fetcher ends up knowing of a partition: its last fetch
    /// parameters as it sent them, and the last high watermark and log start
    /// it was answered.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Known {
        high_watermark: i64,
        log_start_offset: i64,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// The fetcher's wanted set: partition -> fetch offset.
        Fetch(BTreeMap<i32, i64>),
        /// The leader's log of a partition moves on: (partition, new hw, new log start).
        Grow(i32, i64, i64),
        /// The connection drops before an answer.
        Fail,
        /// The leader loses the session (evicted, restarted).
        Lose,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => proptest::collection::btree_map(0..6i32, 0..4i64, 0..6).prop_map(Step::Fetch),
            4 => (0..6i32, 0..3i64, 0..2i64).prop_map(|(p, hw, ls)| Step::Grow(p, hw, ls)),
            1 => Just(Step::Fail),
            1 => Just(Step::Lose),
        ]
    }

    proptest! {
        /// Driving both ends: after every answered request the fetcher knows
        /// exactly what a full answer would have told it (every wanted
        /// partition's high watermark and log start), and the leader reads
        /// exactly the fetcher's wanted partitions at the offsets it asked.
        #[test]
        fn incremental_answers_tell_the_fetcher_what_full_ones_would(steps in proptest::collection::vec(step(), 1..60)) {
            let mut leader = SessionCache::new(4, Duration::from_secs(120));
            let mut fetcher = SessionBuilder::new();
            // The leader's logs: partition -> (hw, log start).
            let mut logs: HashMap<i32, (i64, i64)> = (0..6).map(|p| (p, (0, 0))).collect();
            let mut known: HashMap<i32, Known> = HashMap::new();
            let now = Instant::now();
            for s in steps {
                match s {
                    Step::Grow(p, hw, ls) => {
                        let l = logs.get_mut(&p).unwrap();
                        l.0 += hw;
                        l.1 = (l.1 + ls).min(l.0);
                    }
                    Step::Lose => {
                        leader = SessionCache::new(4, Duration::from_secs(120));
                    }
                    Step::Fail => {
                        let _ = fetcher.build(&BTreeMap::new());
                        fetcher.on_failure();
                        known.clear();
                    }
                    Step::Fetch(wanted) => {
                        let wanted: BTreeMap<TopicPartition, FetchParams> =
                            wanted.iter().map(|(p, o)| (tp(*p), params(*o))).collect();
                        let req = fetcher.build(&wanted);
                        let ctx = leader.begin(req.session_id, req.epoch, &req.send, &req.forget, now);
                        let (session_id, answered) = match ctx {
                            Err(e) => {
                                // The wanted set stays; the next request is full.
                                prop_assert!(!fetcher.on_response(e.code().code(), 0));
                                known.clear();
                                continue;
                            }
                            Ok(FetchContext::Full { create }) => {
                                let read: Vec<(TopicPartition, FetchParams, Answer)> = req
                                    .send
                                    .iter()
                                    .map(|(t, p)| {
                                        let (hw, ls) = logs[&t.partition];
                                        (t.clone(), *p, Answer { records: false, high_watermark: hw, log_start_offset: ls, error: false, diverging: false })
                                    })
                                    .collect();
                                let names: Vec<(i32, Answer)> = read.iter().map(|(t, _, a)| (t.partition, *a)).collect();
                                let id = if create { leader.create(false, read, now) } else { 0 };
                                known.clear();
                                (id, names)
                            }
                            Ok(FetchContext::Incremental { session_id, partitions }) => {
                                let read: Vec<(i32, i64)> = partitions.iter().map(|(t, p)| (t.partition, p.fetch_offset)).collect();
                                let mut want: Vec<(i32, i64)> = wanted.iter().map(|(t, p)| (t.partition, p.fetch_offset)).collect();
                                let mut got = read.clone();
                                want.sort();
                                got.sort();
                                prop_assert_eq!(got, want, "the leader reads what the fetcher wants");
                                let mut names = Vec::new();
                                for (t, _) in &partitions {
                                    let (hw, ls) = logs[&t.partition];
                                    let a = Answer { records: false, high_watermark: hw, log_start_offset: ls, error: false, diverging: false };
                                    if leader.respond(session_id, t, a) {
                                        names.push((t.partition, a));
                                    }
                                }
                                (session_id, names)
                            }
                        };
                        prop_assert!(fetcher.on_response(0, session_id));
                        for (p, a) in answered {
                            known.insert(p, Known { high_watermark: a.high_watermark, log_start_offset: a.log_start_offset });
                        }
                        known.retain(|p, _| wanted.contains_key(&tp(*p)));
                        for t in wanted.keys() {
                            let (hw, ls) = logs[&t.partition];
                            prop_assert_eq!(known.get(&t.partition).copied(), Some(Known { high_watermark: hw, log_start_offset: ls }), "partition {}", t.partition);
                        }
                    }
                }
            }
        }
    }
}
