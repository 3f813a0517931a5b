//! A bounded pool of PostgreSQL connections: a caller takes one (waiting while all are
//! in use), and it goes back when dropped, unless the server closed it. The bound keeps
//! a replica's reads within the connections it is given (`max_connections` is the
//! server's, shared by every replica).

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::database::Database;
use crate::error::{Error, Result};

/// How long a caller waits for a connection before it is told the pool is exhausted.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Pool {
    url: String,
    max: usize,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    idle: Vec<Database>,
    /// Connections open, idle or lent.
    open: usize,
}

/// A connection lent by a [`Pool`].
pub struct Pooled<'p> {
    pool: &'p Pool,
    db: Option<Database>,
}

impl Pool {
    /// A pool of at most `max` (at least 1) connections to `url`; none is opened yet.
    pub fn new(url: &str, max: usize) -> Self {
        Pool {
            url: url.to_string(),
            max: max.max(1),
            state: Mutex::new(State {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// An idle connection, a new one while fewer than `max` are open, or the first one
    /// given back within [`WAIT`].
    pub fn get(&self) -> Result<Pooled<'_>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(db) = state.idle.pop() {
                return Ok(Pooled {
                    pool: self,
                    db: Some(db),
                });
            }
            if state.open < self.max {
                state.open += 1;
                drop(state);
                return match Database::postgres(&self.url) {
                    Ok(db) => Ok(Pooled {
                        pool: self,
                        db: Some(db),
                    }),
                    Err(e) => {
                        self.forget_one();
                        Err(e)
                    }
                };
            }
            let (next, timeout) = self
                .freed
                .wait_timeout(state, WAIT)
                .unwrap_or_else(|p| p.into_inner());
            state = next;
            if timeout.timed_out() && state.idle.is_empty() && state.open >= self.max {
                return Err(Error::Exhausted(format!(
                    "all {} connections to the database stayed in use for {WAIT:?}",
                    self.max
                )));
            }
        }
    }

    fn forget_one(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.open -= 1;
        self.freed.notify_one();
    }
}

/// The idle connections are closed on a thread of their own: closing one blocks, and a
/// pool may go with the last owner of an async server's state, on an async worker.
impl Drop for Pool {
    fn drop(&mut self) {
        let idle =
            std::mem::take(&mut self.state.get_mut().unwrap_or_else(|p| p.into_inner()).idle);
        if !idle.is_empty() {
            let _ = std::thread::Builder::new()
                .name("gpufleet-pool-close".into())
                .spawn(move || drop(idle));
        }
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else { return };
        if db.is_closed() {
            self.pool.forget_one();
            return;
        }
        let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        state.idle.push(db);
        self.pool.freed.notify_one();
    }
}

impl Deref for Pooled<'_> {
    type Target = Database;
    fn deref(&self) -> &Database {
        self.db.as_ref().expect("lent until dropped")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Database {
        self.db.as_mut().expect("lent until dropped")
    }
}
