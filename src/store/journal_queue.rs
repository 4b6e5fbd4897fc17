//! What the journal's writer receives, and how it gathers a batch: the same
//! for the SQLite journal thread and the pool task.

use tokio::sync::{mpsc, oneshot};

use super::journal::{Admitted, ExecutionFinish, NewExecution};
use crate::error::Result;

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;

/// One journal write.
#[derive(Debug)]
pub(super) enum JournalWrite {
    /// A new row, owned by the instance writing it.
    Insert {
        row: Box<NewExecution>,
        instance_id: String,
    },
    Finish {
        id: String,
        finish: ExecutionFinish,
        at: i64,
    },
}

pub(super) struct Request {
    pub write: JournalWrite,
    pub done: oneshot::Sender<Result<Admitted>>,
}

/// What the writer receives.
pub(super) enum Message {
    Write(Request),
    /// Finish what is queued, give the connection back and stop (at shutdown, so
    /// the pool can close).
    Close(oneshot::Sender<()>),
    /// Records wait in the journal's log to be folded into the table (SQLite
    /// files only).
    Fold,
    /// Answer once every record appended so far is folded (SQLite files
    /// only; an async caller waits here instead of blocking its worker).
    Settle(Settle),
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write.fmt(f)
    }
}

/// Who waits for the journal's log to be folded ([`Message::Settle`]).
pub(super) type Settle = oneshot::Sender<Result<()>>;

/// What the writer takes off its queue in one go.
#[derive(Default)]
pub(super) struct Gathered {
    /// Writes to commit, in order.
    pub batch: Vec<Request>,
    /// Callers to answer once the log is folded.
    pub settles: Vec<Settle>,
    /// The close request, if one came: the writer commits the batch and stops.
    pub close: Option<oneshot::Sender<()>>,
}

/// The writes that have gathered behind `first` (at most [`MAX_BATCH`]), the
/// callers waiting for a fold, and the close request if one came among them.
pub(super) fn gather(first: Message, receiver: &mut mpsc::Receiver<Message>) -> Gathered {
    let mut gathered = Gathered::default();
    let mut next = Some(first);
    while let Some(message) = next {
        match message {
            Message::Write(request) => gathered.batch.push(request),
            Message::Settle(done) => gathered.settles.push(done),
            Message::Close(done) => {
                gathered.close = Some(done);
                break;
            }
            // Every gathering ends in a fold; the nudge only woke the writer.
            Message::Fold => {}
        }
        if gathered.batch.len() >= MAX_BATCH {
            break;
        }
        next = receiver.try_recv().ok();
    }
    gathered
}

/// Records a batch's size and commit time in the metrics.
pub(super) fn observe_batch(rows: usize, started: std::time::Instant) {
    let metrics = crate::metrics::metrics();
    if metrics.enabled() {
        metrics.journal_batch_rows.observe(rows as f64);
        metrics
            .journal_commit_seconds
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Answers every caller of a committed batch. A batch that failed is given
/// back to be retried one write at a time: one bad write must not fail its
/// neighbours, and every caller gets its own answer.
pub(super) fn answer(
    batch: Vec<Request>,
    committed: Result<Vec<Admitted>>,
) -> Option<Vec<Request>> {
    match committed {
        Ok(admitted) => {
            for (request, admitted) in batch.into_iter().zip(admitted) {
                let _ = request.done.send(Ok(admitted));
            }
            None
        }
        Err(err) => {
            tracing::warn!(error = %err, writes = batch.len(), "journal batch failed; retrying one by one");
            Some(batch)
        }
    }
}
