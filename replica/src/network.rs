//! The group's transport: openraft's calls as HTTP POSTs (axum serves them, reqwest sends
//! them): `/raft/append` and `/raft/vote` with bincode bodies, and `/raft/snapshot`, a whole
//! snapshot streamed from its file into a file of the receiver's (openraft's
//! `generic-snapshot-data`: no chunks of it are held in memory or answered one by one).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::storage::Snapshot;
use openraft::{BasicNode, OptionalSend, Vote};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::snapshot_files::SnapshotFiles;
use crate::snapshot_stream::{read_pieces, Writer};
use crate::types::{NodeId, Raft, SnapshotMeta, TypeConfig};

/// Faults of the messages this node sends (crash runs): each call is dropped (it fails as
/// unreachable, unsent), delayed, or sent twice (the second answer is the one used), each
/// with its probability, drawn from a seeded generator.
#[derive(Clone, Debug, Default)]
pub struct MessageFaults {
    pub drop: f64,
    pub duplicate: f64,
    /// Each call waits a time drawn uniformly from this range before it is sent.
    pub delay: Option<(Duration, Duration)>,
    pub seed: u64,
}

/// What befalls one call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Fate {
    drop: bool,
    duplicate: bool,
    delay: Option<Duration>,
}

/// Links this node refuses to use, both ways (a network partition, for tests and crash
/// runs): calls to a cut peer fail as unreachable, and calls from one are refused. And the
/// faults of the messages it sends.
#[derive(Default)]
pub struct Links {
    cut: Mutex<HashSet<NodeId>>,
    faults: Mutex<Option<(MessageFaults, SmallRng)>>,
}

impl Links {
    /// Sends every message with `faults` from now on (`None`: none).
    pub fn set_faults(&self, faults: Option<MessageFaults>) {
        *self.faults.lock() = faults.map(|f| {
            let rng = SmallRng::seed_from_u64(f.seed);
            (f, rng)
        });
    }

    fn fate(&self) -> Fate {
        let mut faults = self.faults.lock();
        let Some((f, rng)) = faults.as_mut() else { return Fate::default() };
        Fate {
            drop: rng.random_bool(f.drop.clamp(0.0, 1.0)),
            duplicate: rng.random_bool(f.duplicate.clamp(0.0, 1.0)),
            delay: f.delay.map(|(lo, hi)| if hi > lo { rng.random_range(lo..=hi) } else { lo }),
        }
    }

    pub fn cut(&self, peer: NodeId) {
        self.cut.lock().insert(peer);
    }

    pub fn heal(&self, peer: NodeId) {
        self.cut.lock().remove(&peer);
    }

    pub fn heal_all(&self) {
        self.cut.lock().clear();
    }

    /// Whether the link to (and from) `peer` is cut.
    pub fn is_cut(&self, peer: NodeId) -> bool {
        self.cut.lock().contains(&peer)
    }

}

/// The largest message body taken: an AppendEntries with tusk's largest record
/// (`log_format::MAX_PAYLOAD`, 3 GiB) and room for its framing.
const MAX_BODY: usize = if usize::BITS > 32 { (4u64 << 30) as usize } else { usize::MAX };

/// How soon a peer that was unreachable is tried again (a refused connection on loopback or
/// a LAN costs next to nothing).
const RETRY_UNREACHABLE: Duration = Duration::from_millis(50);

/// The request header naming the calling node.
const FROM: &str = "x-tusk-node";

#[derive(Clone)]
struct Served {
    raft: Raft,
    links: Arc<Links>,
    /// Where snapshots sent to this node are received.
    snapshots: SnapshotFiles,
}


fn refused_from(served: &Served, headers: &axum::http::HeaderMap) -> bool {
    headers.get(FROM).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).is_some_and(|from| served.links.is_cut(from))
}

type Reply = Result<Vec<u8>, (StatusCode, String)>;

fn request<T: DeserializeOwned>(body: &Bytes) -> Result<T, (StatusCode, String)> {
    bincode::deserialize(body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))
}

fn reply<T: Serialize>(value: &T) -> Reply {
    bincode::serialize(value).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

const CUT: (StatusCode, &str) = (StatusCode::SERVICE_UNAVAILABLE, "link cut");

async fn append(State(s): State<Served>, headers: axum::http::HeaderMap, body: Bytes) -> Reply {
    if refused_from(&s, &headers) {
        return Err((CUT.0, CUT.1.into()));
    }
    reply(&s.raft.append_entries(request::<AppendEntriesRequest<TypeConfig>>(&body)?).await)
}

async fn vote(State(s): State<Served>, headers: axum::http::HeaderMap, body: Bytes) -> Reply {
    if refused_from(&s, &headers) {
        return Err((CUT.0, CUT.1.into()));
    }
    reply(&s.raft.vote(request::<VoteRequest<NodeId>>(&body)?).await)
}

/// A snapshot stream: `[u64 length][bincode (vote, meta)]`, then the snapshot file's bytes.
/// Received into a file of the node's snapshots, then installed.
async fn snapshot(State(s): State<Served>, headers: axum::http::HeaderMap, body: Body) -> Reply {
    if refused_from(&s, &headers) {
        return Err((CUT.0, CUT.1.into()));
    }
    let bad = |e: String| (StatusCode::BAD_REQUEST, e);
    let failed = |e: std::io::Error| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut stream = body.into_data_stream();
    let mut head: Vec<u8> = Vec::new();
    let (vote, meta, rest) = loop {
        if head.len() >= 8 {
            let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) as usize;
            if len > 1 << 20 {
                return Err(bad(format!("a snapshot head of {len} bytes")));
            }
            if head.len() >= 8 + len {
                let (vote, meta): (Vote<NodeId>, SnapshotMeta) = bincode::deserialize(&head[8..8 + len]).map_err(|e| bad(e.to_string()))?;
                break (vote, meta, head.split_off(8 + len));
            }
        }
        match stream.next().await {
            Some(Ok(piece)) => head.extend_from_slice(&piece),
            Some(Err(e)) => return Err(bad(e.to_string())),
            None => return Err(bad("the snapshot stream ended in its head".into())),
        }
    };
    let (file, path) = s.snapshots.new_file("receiving").map_err(failed)?;
    let writer = Writer::new(file).map_err(failed)?;
    let received: Result<std::fs::File, (StatusCode, String)> = async {
        let mut open = writer.write(Bytes::from(rest)).await;
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| bad(e.to_string()))?;
            open = open && writer.write(piece).await;
        }
        writer.finish().await.map_err(failed)
    }
    .await;
    let file = match received {
        Ok(file) => tokio::fs::File::from_std(file),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    };
    reply(&s.raft.install_full_snapshot(vote, Snapshot { meta, snapshot: Box::new(file) }).await)
}

/// Serves `raft` on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    raft: Raft,
    links: Arc<Links>,
    snapshots: SnapshotFiles,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        // axum refuses bodies past 2 MB by default: an entry holds a transaction's record, up
        // to tusk's largest (3 GiB), and a refused AppendEntries would stall the group.
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Served { raft, links, snapshots });
    // Answers go out at once, not held back for the peer's acknowledgement (Nagle), as the
    // client's requests do (reqwest sets TCP_NODELAY).
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, app).with_graceful_shutdown(stop).await
}

/// Makes a client per peer (openraft asks for one per target).
pub struct Network {
    pub me: NodeId,
    pub client: reqwest::Client,
    pub links: Arc<Links>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        // Parsed once: the append route is called for every entry sent.
        let append_url = reqwest::Url::parse(&format!("http://{}/raft/append", node.addr)).ok();
        let link = Link { me: self.me, target, addr: node.addr.clone(), append_url, client: self.client.clone(), links: self.links.clone() };
        Peer { link, notices: Arc::default() }
    }
}

/// One peer's client: openraft makes one per replication stream (a leader's term), and one
/// for each of its leadership checks.
pub struct Peer {
    link: Link,
    notices: Arc<Mutex<Notices>>,
}

/// What one peer's client sends with.
#[derive(Clone)]
struct Link {
    me: NodeId,
    target: NodeId,
    addr: String,
    append_url: Option<reqwest::Url>,
    client: reqwest::Client,
    links: Arc<Links>,
}

/// Commit notices to one peer: AppendEntries without entries at the log id the peer last
/// confirmed holding. openraft 0.9 sends one after every commit (and as its heartbeat) and
/// keeps one AppendEntries in flight per peer, so the next entries waited behind the
/// notice's round trip. A notice's success tells the leader nothing it does not know (the
/// peer holds what it confirmed in this client, under this leader's vote), so it is answered
/// as one at once and sent behind the caller's back (the newest one only, one at a time). A
/// notice that comes back with anything else (a higher vote, a conflict) or fails stops the
/// early answers: the next call goes in full and hears it. openraft's leadership checks make
/// a client of their own, with nothing confirmed, so their calls always go in full; what an
/// early answer moves is only the leader's time of its last heard quorum, a metric here.
#[derive(Default)]
struct Notices {
    /// The peer's last log id it confirmed holding, by an answer to entries sent in this
    /// client (so under its leader's vote).
    confirmed: Option<openraft::LogId<NodeId>>,
    sending: bool,
    next: Option<AppendEntriesRequest<TypeConfig>>,
}

impl Notices {
    /// Takes `rpc` to send behind the caller's back if it is a notice at the confirmed log id;
    /// the caller answers it as a success. `Err(rpc)`: send it in full.
    fn take(this: &Arc<Mutex<Self>>, rpc: AppendEntriesRequest<TypeConfig>, link: &Link, option: RPCOption) -> Result<(), AppendEntriesRequest<TypeConfig>> {
        let mut notices = this.lock();
        if !notices.answers_early(&rpc) {
            return Err(rpc);
        }
        notices.next = Some(rpc);
        if !notices.sending {
            notices.sending = true;
            tokio::spawn(Self::send(this.clone(), link.clone(), option));
        }
        Ok(())
    }

    async fn send(this: Arc<Mutex<Self>>, link: Link, option: RPCOption) {
        loop {
            let rpc = {
                let mut notices = this.lock();
                let Some(rpc) = notices.next.take() else {
                    notices.sending = false;
                    return;
                };
                rpc
            };
            let answer: Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> = link.call("append", &rpc, &option).await;
            if !matches!(answer, Ok(AppendEntriesResponse::Success)) {
                let mut notices = this.lock();
                notices.failed();
                notices.sending = false;
                return;
            }
        }
    }

    /// Whether `rpc` is a notice at the log id the peer confirmed.
    fn answers_early(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        rpc.entries.is_empty() && rpc.prev_log_id.is_some() && rpc.prev_log_id == self.confirmed
    }

    /// A notice came back with something else than a success, or failed: notices go in full
    /// again (the newest waiting one too) until entries are confirmed again.
    fn failed(&mut self) {
        self.confirmed = None;
        self.next = None;
    }

    /// Notes what an AppendEntries sent in full was answered.
    fn answered(&mut self, rpc_last: Option<openraft::LogId<NodeId>>, answer: &AppendEntriesResponse<NodeId>) {
        self.confirmed = match answer {
            AppendEntriesResponse::Success => rpc_last,
            AppendEntriesResponse::PartialSuccess(matching) => *matching,
            _ => None,
        };
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CallError(String);

impl Link {
    async fn call<Req, Resp, E>(&self, route: &str, req: &Req, option: &RPCOption) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let fate = self.links.fate();
        if self.links.is_cut(self.target) || fate.drop {
            return Err(RPCError::Unreachable(Unreachable::new(&CallError(format!("link to node {} cut, or the message dropped", self.target)))));
        }
        if let Some(delay) = fate.delay {
            tokio::time::sleep(delay).await;
        }
        let body = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let url = match (&self.append_url, route) {
            (Some(url), "append") => url.clone(),
            _ => reqwest::Url::parse(&format!("http://{}/raft/{route}", self.addr)).map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
        };
        let send = || {
            self.client
                .post(url.clone())
                .header(FROM, self.me.to_string())
                .timeout(option.hard_ttl())
                .body(body.clone())
                .send()
        };
        if fate.duplicate {
            // The first copy's answer is dropped, as a network that delivered it twice would.
            let _ = send().await;
        }
        let sent = send().await.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        if !sent.status().is_success() {
            let status = sent.status();
            let text = sent.text().await.unwrap_or_default();
            return Err(RPCError::Unreachable(Unreachable::new(&CallError(format!("node {}: {status}: {text}", self.target)))));
        }
        let bytes = sent.bytes().await.map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer: Result<Resp, RaftError<NodeId, E>> = bincode::deserialize(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let rpc = match Notices::take(&self.notices, rpc, &self.link, option.clone()) {
            Ok(()) => return Ok(AppendEntriesResponse::Success),
            Err(rpc) => rpc,
        };
        let last = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
        let answer = self.link.call("append", &rpc, &option).await;
        match &answer {
            Ok(answer) => self.notices.lock().answered(last, answer),
            Err(_) => self.notices.lock().failed(),
        }
        answer
    }

    /// Streams the snapshot's file (see the `snapshot` route); the answer comes once the peer
    /// installed it. Links and message faults apply as to any call (a stream is dropped or
    /// delayed, never sent twice).
    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let link = &self.link;
        let fate = link.links.fate();
        if link.links.is_cut(link.target) || fate.drop {
            return Err(StreamingError::Unreachable(Unreachable::new(&CallError(format!("link to node {} cut, or the snapshot dropped", link.target)))));
        }
        if let Some(delay) = fate.delay {
            tokio::time::sleep(delay).await;
        }
        let network = |e: &dyn std::error::Error| StreamingError::Network(NetworkError::new(&CallError(e.to_string())));
        let head = bincode::serialize(&(vote, &snapshot.meta)).map_err(|e| network(&e))?;
        let mut file = snapshot.snapshot.into_std().await;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).map_err(|e| network(&e))?;
        let mut prefix = (head.len() as u64).to_le_bytes().to_vec();
        prefix.extend_from_slice(&head);
        let pieces = futures_util::stream::unfold(read_pieces(file), |mut rx| async move { rx.recv().await.map(|piece| (piece, rx)) });
        let body = futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(prefix)) }).chain(pieces);
        let send = link.client.post(format!("http://{}/raft/snapshot", link.addr)).header(FROM, link.me.to_string()).body(reqwest::Body::wrap_stream(body)).send();
        let sent = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            sent = send => sent.map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))?,
        };
        if !sent.status().is_success() {
            let status = sent.status();
            let text = sent.text().await.unwrap_or_default();
            return Err(StreamingError::Unreachable(Unreachable::new(&CallError(format!("node {}: {status}: {text}", link.target)))));
        }
        let bytes = sent.bytes().await.map_err(|e| network(&e))?;
        let answer: Result<SnapshotResponse<NodeId>, Fatal<NodeId>> = bincode::deserialize(&bytes).map_err(|e| network(&e))?;
        answer.map_err(|e| StreamingError::RemoteError(RemoteError::new(link.target, e)))
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.link.call("vote", &rpc, &option).await
    }

    /// Retries a peer that was unreachable every 50 ms (`RETRY_UNREACHABLE`; openraft's default,
    /// 500 ms, left a member back from a restart waiting that long for the leader to notice).
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(RETRY_UNREACHABLE))
    }
}

/// The address a node listens on, as peers reach it.
pub fn node_for(addr: SocketAddr) -> BasicNode {
    BasicNode::new(addr.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn request(prev: Option<u64>, entries: &[u64]) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: prev.map(id),
            leader_commit: prev.map(id),
            entries: entries.iter().map(|&i| Entry { log_id: id(i), payload: EntryPayload::Blank }).collect(),
        }
    }

    #[test]
    fn only_a_notice_at_the_confirmed_log_id_is_answered_early() {
        let mut n = Notices::default();
        assert!(!n.answers_early(&request(Some(3), &[])), "nothing confirmed yet (a leadership check's client is new)");
        n.answered(Some(id(5)), &AppendEntriesResponse::Success);
        assert!(n.answers_early(&request(Some(5), &[])));
        assert!(!n.answers_early(&request(Some(4), &[])), "a notice below what the peer confirmed goes in full");
        assert!(!n.answers_early(&request(Some(6), &[])), "nor one past it (a probe)");
        assert!(!n.answers_early(&request(Some(5), &[6])), "entries always go in full");
        n.answered(Some(id(7)), &AppendEntriesResponse::PartialSuccess(Some(id(6))));
        assert!(n.answers_early(&request(Some(6), &[])), "a partial success confirms what it says");
        n.answered(Some(id(7)), &AppendEntriesResponse::Conflict);
        assert!(!n.answers_early(&request(Some(6), &[])), "a conflict confirms nothing");
        n.answered(Some(id(8)), &AppendEntriesResponse::Success);
        n.next = Some(request(Some(8), &[]));
        n.failed();
        assert!(!n.answers_early(&request(Some(8), &[])), "after a notice failed, notices go in full");
        assert!(n.next.is_none(), "and the one waiting is dropped (the next goes in full)");
    }
}
