//! The three ways a layer's union travels: each substrate's worker (echoing
//! a reply of the size the request names, so only transport is measured)
//! and its client.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use futures_util::StreamExt;
use zenoh::Wait;

use crate::BoxResult;

/// The zenoh key and NATS subject the worker serves.
const ZENOH_KEY: &str = "strata/bench/layer";
const NATS_SUBJECT: &str = "strata.bench.layer";
/// How long a client waits for one reply before calling the worker lost.
const REPLY_DEADLINE: Duration = Duration::from_secs(10);

/// A request is `request_bytes` long; its first 8 bytes name the reply's size.
pub fn request(request_bytes: usize, reply_bytes: usize) -> Vec<u8> {
    let mut request = vec![0x5au8; request_bytes.max(8)];
    request[..8].copy_from_slice(&(reply_bytes as u64).to_le_bytes());
    request
}

fn reply_to(request: &[u8]) -> BoxResult<Vec<u8>> {
    let head: [u8; 8] = request.get(..8).ok_or("request shorter than its header")?.try_into()?;
    let reply_bytes = usize::try_from(u64::from_le_bytes(head))?;
    if reply_bytes > 64 << 20 {
        return Err(format!("a reply of {reply_bytes} bytes is past the bench's 64 MiB").into());
    }
    Ok(vec![0xa5u8; reply_bytes])
}

/// One round trip: the request out, the reply's length back.
pub trait Client {
    fn call(&mut self, request: &[u8]) -> BoxResult<usize>;
}

// --- plain TCP: a length-prefixed frame each way (the floor, home-made) ---

fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> BoxResult<()> {
    stream.write_all(&u32::try_from(bytes.len())?.to_le_bytes())?;
    stream.write_all(bytes)?;
    Ok(())
}

fn read_frame(stream: &mut TcpStream) -> BoxResult<Vec<u8>> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head)?;
    let mut body = vec![0u8; u32::from_le_bytes(head) as usize];
    stream.read_exact(&mut body)?;
    Ok(body)
}

pub fn serve_tcp(listen: &str) -> BoxResult<()> {
    let listener = std::net::TcpListener::bind(listen)?;
    for stream in listener.incoming() {
        let mut stream = stream?;
        stream.set_nodelay(true)?;
        std::thread::spawn(move || -> BoxResult<()> {
            loop {
                let request = read_frame(&mut stream)?;
                write_frame(&mut stream, &reply_to(&request)?)?;
            }
        });
    }
    Ok(())
}

pub struct TcpClient(TcpStream);

impl TcpClient {
    pub fn connect(addr: &str) -> BoxResult<TcpClient> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(REPLY_DEADLINE))?;
        Ok(TcpClient(stream))
    }
}

impl Client for TcpClient {
    fn call(&mut self, request: &[u8]) -> BoxResult<usize> {
        write_frame(&mut self.0, request)?;
        Ok(read_frame(&mut self.0)?.len())
    }
}

// --- Zenoh: a peer-mode session; the worker a queryable, the client `get` ---

fn zenoh_config(listen: Option<&str>, connect: Option<&str>) -> BoxResult<zenoh::Config> {
    let mut config = zenoh::Config::default();
    config.insert_json5("mode", r#""peer""#)?;
    // Peers are named, not found: the flags are the contract.
    config.insert_json5("scouting/multicast/enabled", "false")?;
    if let Some(listen) = listen {
        config.insert_json5("listen/endpoints", &format!(r#"["tcp/{listen}"]"#))?;
    }
    if let Some(connect) = connect {
        config.insert_json5("connect/endpoints", &format!(r#"["tcp/{connect}"]"#))?;
    }
    Ok(config)
}

pub fn serve_zenoh(listen: &str) -> BoxResult<()> {
    let session = zenoh::open(zenoh_config(Some(listen), None)?).wait()?;
    let queryable = session.declare_queryable(ZENOH_KEY).wait()?;
    while let Ok(query) = queryable.recv() {
        let request = query.payload().map(|payload| payload.to_bytes().into_owned()).unwrap_or_default();
        query.reply(ZENOH_KEY, reply_to(&request)?).wait()?;
    }
    Ok(())
}

pub struct ZenohClient(zenoh::Session);

impl ZenohClient {
    pub fn connect(addr: &str) -> BoxResult<ZenohClient> {
        Ok(ZenohClient(zenoh::open(zenoh_config(None, Some(addr))?).wait()?))
    }
}

impl Client for ZenohClient {
    fn call(&mut self, request: &[u8]) -> BoxResult<usize> {
        let replies = self
            .0
            .get(ZENOH_KEY)
            .payload(request.to_vec())
            .consolidation(zenoh::query::ConsolidationMode::None)
            .timeout(REPLY_DEADLINE)
            .wait()?;
        let reply = replies.recv().map_err(|_| "no worker answered")?;
        let sample = reply.result().map_err(|error| format!("worker error: {error:?}"))?;
        Ok(sample.payload().len())
    }
}

// --- NATS: worker and client both connect to a nats-server ---

fn runtime() -> BoxResult<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

pub fn serve_nats(server: &str) -> BoxResult<()> {
    runtime()?.block_on(async {
        let client = async_nats::connect(server).await?;
        let mut requests = client.subscribe(NATS_SUBJECT).await?;
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                client.publish(reply, reply_to(&message.payload)?.into()).await?;
            }
        }
        Ok(())
    })
}

pub struct NatsClient {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
}

impl NatsClient {
    pub fn connect(server: &str) -> BoxResult<NatsClient> {
        let runtime = runtime()?;
        let client = runtime
            .block_on(async_nats::ConnectOptions::new().request_timeout(Some(REPLY_DEADLINE)).connect(server))?;
        Ok(NatsClient { runtime, client })
    }
}

impl Client for NatsClient {
    fn call(&mut self, request: &[u8]) -> BoxResult<usize> {
        let reply = self.runtime.block_on(self.client.request(NATS_SUBJECT, request.to_vec().into()))?;
        Ok(reply.payload.len())
    }
}
