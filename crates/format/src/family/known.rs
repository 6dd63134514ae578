//! What a family knows of a checkpoint: the config.json keys its file reads,
//! those known not to change what the model computes, and the tensors known
//! to be left unread. Each family file declares one [`Known`] table; this
//! module is the one place that checks a checkpoint against it, so that
//! nothing is converted as something it is not: a key or tensor outside the
//! table is refused by name (`--allow-unknown-config KEY` lets a key
//! through).
//!
//! Nested objects: one the family reads (`rope_parameters`/`rope_scaling`,
//! `quantization_config`, a wrapper's `text_config`) is checked key by key
//! against its own table and its keys named `object.key`; one it does not
//! read (a `vision_config` of a tower that is not loaded) is an inert key
//! whose contents are not looked at.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::Family;
use crate::error::{Error, Result};
use crate::spec::ModelArch;

/// The keys of one config object.
#[derive(Debug)]
pub(crate) struct ConfigKeys {
    /// Keys the family's parser reads (groups shared with the other
    /// families of its kind, then its own).
    pub read: &'static [&'static [&'static str]],
    /// Keys transformers does not let change the computation: training-only
    /// settings, bookkeeping, sub-configs of towers that are not loaded.
    pub inert: &'static [&'static [&'static str]],
    /// Objects read key by key, each with its table.
    pub nested: &'static [(&'static str, &'static ConfigKeys)],
}

/// A family's whole table: its config's keys and the tensors it leaves
/// unread on purpose.
#[derive(Debug)]
pub(crate) struct Known {
    pub config: ConfigKeys,
    /// Tensor name patterns (`*` matches any run of characters) of tensors
    /// known to be unused: a tower that is not loaded, a rotary cache.
    pub unused_tensors: &'static [&'static str],
    /// Decoder layers past `num_hidden_layers` (multi-token-prediction
    /// modules, appended as extra layers) are known to be unused.
    pub extra_layers_unused: bool,
}

/// Keys every transformers config may carry that change nothing Strata
/// computes: `PreTrainedConfig`'s own, the Hub's bookkeeping, and the
/// training-only settings every MoE config class has.
pub(crate) const HF_INERT: &[&str] = &[
    "_name_or_path",
    "architectures",
    "auto_map",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "use_cache",
    "initializer_range",
    "pad_token_id",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "tokenizer_class",
    "attention_dropout",
    "output_router_logits",
    "router_aux_loss_coef",
];

/// The keys of the rope object (`rope_parameters`, or 4.x's
/// `rope_scaling`), as `parse_rope` reads them for every rope type it
/// accepts.
pub(crate) const ROPE: ConfigKeys = ConfigKeys {
    read: &[&[
        "rope_type",
        "type",
        "rope_theta",
        "factor",
        "partial_rotary_factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
        "truncate",
    ]],
    inert: &[],
    nested: &[],
};

/// `quantization_config`: the FP8 block size is read; the other keys name
/// the format that the tensors' own dtypes and names already tell.
pub(crate) const QUANTIZATION: ConfigKeys = ConfigKeys {
    read: &[&["weight_block_size"]],
    inert: &[&["quant_method", "fmt", "activation_scheme", "modules_to_not_convert"]],
    nested: &[],
};

/// The nested objects every family reads alike.
pub(crate) const ROPE_AND_QUANTIZATION: &[(&str, &ConfigKeys)] =
    &[("rope_parameters", &ROPE), ("rope_scaling", &ROPE), ("quantization_config", &QUANTIZATION)];

impl ConfigKeys {
    fn lists(lists: &'static [&'static [&'static str]]) -> impl Iterator<Item = &'static str> {
        lists.iter().flat_map(|list| list.iter().copied())
    }

    /// Every key the family reads here.
    pub(crate) fn read_keys(&self) -> impl Iterator<Item = &'static str> {
        Self::lists(self.read)
    }

    /// Every key known not to change the computation here.
    pub(crate) fn inert_keys(&self) -> impl Iterator<Item = &'static str> {
        Self::lists(self.inert)
    }

    fn nested_table(&self, key: &str) -> Option<&'static ConfigKeys> {
        self.nested.iter().find(|(name, _)| *name == key).map(|(_, table)| *table)
    }

    fn knows(&self, key: &str) -> bool {
        self.read_keys().chain(self.inert_keys()).any(|k| k == key) || self.nested_table(key).is_some()
    }

    /// The keys of `object` this table does not know, as `prefix + key`,
    /// those of the nested objects it reads included.
    fn unknown(&self, object: &Map<String, Value>, prefix: &str, out: &mut Vec<String>) {
        for (key, value) in object {
            match (self.nested_table(key), value) {
                (Some(table), Value::Object(inner)) => table.unknown(inner, &format!("{prefix}{key}."), out),
                _ if self.knows(key) => {}
                _ => out.push(format!("{prefix}{key}")),
            }
        }
    }
}

/// The table `family` checks a config's top level with: its own, or, for a
/// text model saved apart from its wrapper (a `model_type` the family
/// [`also reads`](super::FamilyDef::also_reads)), the wrapper's
/// `text_config` table.
fn top_level_keys(family: Family, model_type: Option<&str>) -> &'static ConfigKeys {
    let own = &family.def().known().config;
    match own.nested_table("text_config") {
        Some(text) if model_type != Some(family.model_type()) => text,
        _ => own,
    }
}

/// The keys of `config` (a config.json object of `family`) that the family
/// neither reads nor knows to be inert, as dotted paths, sorted.
pub(crate) fn unknown_config_keys(family: Family, config: &Map<String, Value>) -> Vec<String> {
    let mut unknown = Vec::new();
    top_level_keys(family, config.get("model_type").and_then(Value::as_str)).unknown(config, "", &mut unknown);
    unknown.sort();
    unknown
}

/// Refuses a config.json object whose family does not know every key,
/// except the keys in `allowed` (dotted paths, as the error names them).
pub fn check_config_keys(config: &Value, allowed: &[String]) -> Result<()> {
    let map = config.as_object().ok_or_else(|| Error::invalid("<root>", "config.json must be a JSON object"))?;
    let family: Family = Family::of_config(map)?;
    let refused: Vec<String> =
        unknown_config_keys(family, map).into_iter().filter(|key| !allowed.contains(key)).collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::UnknownConfigKeys { family: family.to_string(), keys: refused.join(", ") })
}

/// Whether `name` matches `pattern`, where `*` matches any run of
/// characters.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else { return false };
            (0..=rest.len()).filter(|&i| rest.is_char_boundary(i)).any(|i| matches(tail, &rest[i..]))
        }
    }
}

/// Whether `name` is a tensor of decoder layer `num_layers` or later under
/// `model_prefix` (`model.layers.61.…` of a 61-layer model).
fn past_last_layer(name: &str, model_prefix: &str, num_layers: usize) -> bool {
    let Some(rest) = name.strip_prefix(model_prefix).and_then(|r| r.strip_prefix("layers.")) else {
        return false;
    };
    let index = rest.split('.').next().unwrap_or_default();
    index.parse::<usize>().is_ok_and(|layer| layer >= num_layers)
}

/// Tensors every family leaves unread: the rotary tables some checkpoints
/// save, which Strata (like transformers) recomputes from the config.
const UNUSED_EVERYWHERE: &[&str] = &["*rotary_emb.inv_freq"];

/// The tensors of `unread` (tensors of a checkpoint of `arch` that no block
/// reads) that its family does not know to be unused: the ones a conversion
/// must refuse. A tied model's own `lm_head` is known: the embedding is
/// read in its place, as transformers does.
pub(crate) fn unknown_tensors(arch: &ModelArch, unread: &BTreeSet<String>) -> Vec<String> {
    let def = arch.core.family.def();
    let (known, naming) = (def.known(), def.naming());
    let stored = |canonical: &str| std::iter::once(canonical.to_owned()).chain(crate::names::aliases(arch, canonical));
    let prefixes: Vec<String> = stored(naming.model_prefix).collect();
    let lm_heads: Vec<String> = stored(naming.lm_head).collect();
    let num_layers = arch.layers.len();
    let expected = |name: &String| {
        known.unused_tensors.iter().chain(UNUSED_EVERYWHERE).any(|p| matches(p, name))
            || (known.extra_layers_unused && prefixes.iter().any(|p| past_last_layer(name, p, num_layers)))
            || (arch.core.tie_word_embeddings && lm_heads.contains(name))
    };
    unread.iter().filter(|name| !expected(name)).cloned().collect()
}

#[cfg(test)]
mod tests;
