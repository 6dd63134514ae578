//! `strata worker`: serves one shard of a model's routed experts to
//! coordinators, through the worker's own expert store and kernels.

use strata_engine::Engine;
use zenoh::Wait;

use crate::key::SharedKey;
use crate::session::{experts_key, open_worker, shard_key, zenoh_error};
use crate::{Error, Result, Shard, wire};

/// What a worker answers on its shard key: `INDEX COUNT ACTIVATIONS HASH`,
/// which a coordinator checks against its own before sending anything.
pub(crate) fn shard_info(shard: Shard, activations: &str, content_hash: &str) -> String {
    format!("{} {} {activations} {content_hash}", shard.index, shard.count)
}

/// Serves `engine`'s experts of `shard` on `listen` (`HOST:PORT`) to peers
/// presenting `key`, until the process ends; `ready` is called once the
/// worker answers.
pub fn serve(engine: &Engine, listen: &str, shard: Shard, key: &SharedKey, ready: impl FnOnce()) -> Result<()> {
    let session = open_worker(listen, key)?;
    let info = shard_info(shard, engine.activations().name(), engine.container().content_hash());
    let (shard_key, experts_key) = (shard_key(shard.index), experts_key(shard.index));
    let shard_queries =
        session.declare_queryable(shard_key.as_str()).wait().map_err(zenoh_error("declaring the shard"))?;
    let expert_queries =
        session.declare_queryable(experts_key.as_str()).wait().map_err(zenoh_error("declaring the experts"))?;
    ready();
    loop {
        // Shard questions are rare and cheap: answered between unions.
        while let Ok(Some(query)) = shard_queries.try_recv() {
            let _ = query.reply(shard_key.as_str(), info.clone()).wait();
        }
        let query = match expert_queries.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(Some(query)) => query,
            Ok(None) => continue,
            Err(error) => return Err(Error::Zenoh(format!("the worker's session ended: {error}"))),
        };
        let payload = query.payload().map(|bytes| bytes.to_bytes().into_owned()).unwrap_or_default();
        let answered = match compute(engine, shard, &payload) {
            Ok(reply) => query.reply(experts_key.as_str(), reply).wait(),
            Err(error) => {
                tracing::warn!(%error, "refused a request");
                query.reply_err(error.to_string()).wait()
            }
        };
        // A coordinator gone before its reply is its own loss, not ours.
        if let Err(error) = answered {
            tracing::debug!(%error, "a reply was not delivered");
        }
    }
}

fn compute(engine: &Engine, shard: Shard, payload: &[u8]) -> Result<Vec<u8>> {
    let request = wire::decode_request(payload)?;
    if let Some(call) = request.calls.iter().find(|call| !shard.holds(call.expert)) {
        return Err(Error::Wire(format!("expert {} is not in shard {shard}", call.expert)));
    }
    let hidden = engine.core().hidden_size;
    if request.hidden != hidden {
        return Err(Error::Wire(format!("hidden states {} wide for a model {hidden} wide", request.hidden)));
    }
    let outputs = engine.run_expert_calls(request.layer, &request.calls)?;
    Ok(wire::encode_reply(&outputs, hidden))
}
