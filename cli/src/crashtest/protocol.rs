//! What a child tells its parent, one line per event on its stdout (a pipe). Each line is
//! written with one write(2) as soon as the event happens, so a kill loses at most the line
//! being written, and a line without its newline is dropped.
//!
//! - `ready <start_lsn> <first_seq>`: the store is open at LSN `start_lsn`; the next
//!   transaction takes sequence number `first_seq`.
//! - `i <thread> <seq> <mode> <word>=<value>,...`: the thread is about to commit this.
//! - `a <thread> <seq> <lsn>`: the commit returned this LSN (acknowledged).
//! - `s <thread> <seq>`: `is_stable(lsn, true)` confirmed a split-phase commit.
//! - `r <thread> <seq> <error>`: the commit was refused (the log failed).
//! - `e <error>`: the child hit an error it should not have.

use super::workload::Writes;

/// How one transaction commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `Commit::Sync`: acknowledged once it and every lower LSN are durable.
    Sync,
    /// `Commit::Async`: acknowledged at once; durable within the group-commit interval.
    Async,
    /// `Commit::Partition`: acknowledged once the thread's log partition holds the record
    /// durably; recovery applies it even beyond an LSN gap.
    Partition,
    /// Async, then `is_stable(lsn, true)`.
    Split,
}

impl Mode {
    /// The letter that stands for the mode in an `i` line.
    pub fn code(self) -> char {
        match self {
            Mode::Sync => 'S',
            Mode::Async => 'A',
            Mode::Partition => 'P',
            Mode::Split => 'T',
        }
    }

    /// The mode a letter of an `i` line stands for (`None` for an unknown letter).
    pub fn from_code(c: &str) -> Option<Mode> {
        match c {
            "S" => Some(Mode::Sync),
            "A" => Some(Mode::Async),
            "P" => Some(Mode::Partition),
            "T" => Some(Mode::Split),
            _ => None,
        }
    }

    /// How the store commits in this mode (a split-phase commit is `Async`).
    pub fn commit(self) -> tusk::Commit {
        match self {
            Mode::Sync => tusk::Commit::Sync,
            Mode::Async | Mode::Split => tusk::Commit::Async,
            Mode::Partition => tusk::Commit::Partition,
        }
    }
}

/// One line from the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `ready`: the child opened the store.
    Ready {
        /// The store's last LSN when the child opened it.
        start_lsn: u64,
        /// The sequence number the child's next transaction takes.
        first_seq: u64,
    },
    /// `i`: a thread is about to commit a transaction (sent before the commit can take its
    /// LSN, so that a record made durable just before the kill is still known).
    Intent {
        /// The committing thread of the child, from 0.
        thread: u32,
        /// The transaction's sequence number.
        seq: u64,
        /// How it commits.
        mode: Mode,
        /// Its data writes: (word index, value).
        writes: Writes,
    },
    /// `a`: the commit returned an LSN; the transaction is acknowledged.
    Ack {
        /// The thread that committed it.
        thread: u32,
        /// The sequence number of the announced transaction.
        seq: u64,
        /// The LSN the commit returned.
        lsn: u64,
    },
    /// `s`: `is_stable(lsn, true)` confirmed a split-phase commit.
    Stable {
        /// The thread that committed it.
        thread: u32,
        /// The sequence number of the acknowledged transaction.
        seq: u64,
    },
    /// `r`: the commit was refused (the log failed).
    Refused {
        /// The thread whose commit was refused.
        thread: u32,
        /// The sequence number of the announced transaction.
        seq: u64,
        /// The error the commit returned, its newlines turned into spaces.
        why: String,
    },
    /// `e`: an error the child should not have hit, its newlines turned into spaces.
    Error(String),
}

impl Event {
    /// The line, newline included.
    pub fn line(&self) -> String {
        match self {
            Event::Ready { start_lsn, first_seq } => format!("ready {start_lsn} {first_seq}\n"),
            Event::Intent { thread, seq, mode, writes } => {
                let w: Vec<String> = writes.iter().map(|(i, v)| format!("{i}={v}")).collect();
                format!("i {thread} {seq} {} {}\n", mode.code(), w.join(","))
            }
            Event::Ack { thread, seq, lsn } => format!("a {thread} {seq} {lsn}\n"),
            Event::Stable { thread, seq } => format!("s {thread} {seq}\n"),
            Event::Refused { thread, seq, why } => format!("r {thread} {seq} {}\n", why.replace('\n', " ")),
            Event::Error(why) => format!("e {}\n", why.replace('\n', " ")),
        }
    }

    /// Parses one line (without its newline).
    pub fn parse(line: &str) -> Result<Event, String> {
        let bad = || format!("unreadable child line {line:?}");
        let mut it = line.splitn(5, ' ');
        let kind = it.next().ok_or_else(bad)?;
        let mut num = || -> Result<u64, String> { it.next().and_then(|s| s.parse().ok()).ok_or_else(bad) };
        match kind {
            "ready" => Ok(Event::Ready { start_lsn: num()?, first_seq: num()? }),
            "a" => Ok(Event::Ack { thread: num()? as u32, seq: num()?, lsn: num()? }),
            "s" => Ok(Event::Stable { thread: num()? as u32, seq: num()? }),
            "r" => {
                let (thread, seq) = (num()? as u32, num()?);
                let rest: Vec<&str> = it.collect();
                Ok(Event::Refused { thread, seq, why: rest.join(" ") })
            }
            "i" => {
                let (thread, seq) = (num()? as u32, num()?);
                let mode = it.next().and_then(Mode::from_code).ok_or_else(bad)?;
                let mut writes = Writes::new();
                for pair in it.next().unwrap_or("").split(',').filter(|s| !s.is_empty()) {
                    let (i, v) = pair.split_once('=').ok_or_else(bad)?;
                    writes.push((i.parse().map_err(|_| bad())?, v.parse().map_err(|_| bad())?));
                }
                Ok(Event::Intent { thread, seq, mode, writes })
            }
            "e" => Ok(Event::Error(line.get(2..).unwrap_or("").to_string())),
            _ => Err(bad()),
        }
    }
}

/// Splits what a child wrote into events; an unterminated last line (the kill cut it) is
/// dropped.
pub fn parse_output(bytes: &[u8]) -> Result<Vec<Event>, String> {
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(last) => &bytes[..=last],
        None => &[][..],
    };
    let text = std::str::from_utf8(complete).map_err(|e| format!("child output is not UTF-8: {e}"))?;
    text.lines().filter(|l| !l.is_empty()).map(Event::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let events = vec![
            Event::Ready { start_lsn: 17, first_seq: 4 },
            Event::Intent { thread: 1, seq: 5, mode: Mode::Split, writes: vec![(131073, 9), (131080, u64::MAX)] },
            Event::Ack { thread: 1, seq: 5, lsn: 22 },
            Event::Stable { thread: 1, seq: 5 },
            Event::Refused { thread: 0, seq: 6, why: "the log failed: p0: EIO".into() },
            Event::Error("boom".into()),
        ];
        let mut bytes: Vec<u8> = events.iter().flat_map(|e| e.line().into_bytes()).collect();
        bytes.extend_from_slice(b"a 0 7 2"); // cut by the kill
        assert_eq!(parse_output(&bytes).unwrap(), events);
    }
}
