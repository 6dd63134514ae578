//! Reasoning as both APIs ask for it: the template variables a client sets
//! (`chat_template_kwargs`, e.g. `enable_thinking: false`), Anthropic's
//! thinking budget, and what a reply of a template that thinks needs: the
//! splitter that keeps the thinking apart and the constraint that ends it
//! at its budget (and holds only the answer to a grammar).

use serde_json::{Map, Value};
use strata_engine::Constraint;
use strata_text::{ReasoningSplitter, ThinkingBudget, ThinkingMarkers, ThinkingStart};

use crate::error::ApiError;
use crate::state::App;

/// Variables one request may set.
pub const TEMPLATE_KWARGS_MAX: usize = 16;
/// The longest variable name accepted, in bytes.
pub const TEMPLATE_KWARG_NAME_BYTES_MAX: usize = 64;
/// The most bytes of JSON all of a request's variables take together.
pub const TEMPLATE_KWARGS_BYTES_MAX: usize = 16 << 10;
/// Variables the server itself gives the template.
const RESERVED: [&str; 4] = ["messages", "add_generation_prompt", "tools", "documents"];

/// What a request asks of the model's thinking.
#[derive(Debug, Clone, Default)]
pub struct Thinking {
    /// Variables for the chat template (`chat_template_kwargs`).
    pub kwargs: Map<String, Value>,
    /// The most tokens the thinking may take (Anthropic's `budget_tokens`).
    pub budget_tokens: Option<u64>,
}

/// `chat_template_kwargs`: an object of at most [`TEMPLATE_KWARGS_MAX`]
/// variables, none of the server's own, within the byte limits (they reach
/// the template, which runs on every one of them).
pub fn template_kwargs(value: Option<Value>) -> Result<Map<String, Value>, ApiError> {
    const PARAM: &str = "chat_template_kwargs";
    let kwargs = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(kwargs)) => kwargs,
        Some(_) => return Err(ApiError::invalid_param(PARAM, "chat_template_kwargs is an object")),
    };
    if kwargs.len() > TEMPLATE_KWARGS_MAX {
        return Err(ApiError::invalid_param(PARAM, format!("at most {TEMPLATE_KWARGS_MAX} variables")));
    }
    if let Some(name) =
        kwargs.keys().find(|k| k.len() > TEMPLATE_KWARG_NAME_BYTES_MAX || RESERVED.contains(&k.as_str()))
    {
        return Err(ApiError::invalid_param(
            PARAM,
            format!(
                "variable {name:?} is not accepted (names are at most {TEMPLATE_KWARG_NAME_BYTES_MAX} bytes, \
                 and none of {RESERVED:?})"
            ),
        ));
    }
    let bytes = serde_json::to_vec(&kwargs).map_or(usize::MAX, |json| json.len());
    if bytes > TEMPLATE_KWARGS_BYTES_MAX {
        return Err(ApiError::invalid_param(
            PARAM,
            format!("chat_template_kwargs take {bytes} bytes of JSON; at most {TEMPLATE_KWARGS_BYTES_MAX}"),
        ));
    }
    Ok(kwargs)
}

impl App {
    /// Whether this model's template marks thinking.
    pub fn thinks(&self) -> bool {
        self.template.as_ref().is_some_and(|t| strata_text::template_thinks(t.source()))
    }

    /// The splitter for a reply that starts at `start` (`ChatPrompt`), when
    /// the template thinks.
    pub fn reasoning_splitter(&self, start: ThinkingStart) -> Option<ReasoningSplitter> {
        self.thinks().then(|| ReasoningSplitter::new(start))
    }

    /// `inner` (a request's grammar), wrapped so that it holds the answer
    /// only and the thinking ends at `budget_tokens`, when the template
    /// thinks and there is either to enforce.
    pub fn thinking_constraint(
        &self,
        start: ThinkingStart,
        budget_tokens: Option<u64>,
        inner: Option<Box<dyn Constraint>>,
    ) -> Result<Option<Box<dyn Constraint>>, ApiError> {
        if !self.thinks() || (budget_tokens.is_none() && inner.is_none()) {
            return Ok(inner);
        }
        let ids = |marker: &str| self.tokenizer.encode(marker, false).map_err(|e| ApiError::internal(e.to_string()));
        let markers =
            ThinkingMarkers { open_ids: ids(strata_text::THINK_OPEN)?, close_ids: ids(strata_text::THINK_CLOSE)? };
        if markers.open_ids.is_empty() || markers.close_ids.is_empty() {
            return Ok(inner);
        }
        let budget = budget_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        Ok(Some(Box::new(ThinkingBudget::new(markers, start, budget, inner))))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn template_kwargs_are_bounded_and_leave_the_servers_variables_alone() {
        assert_eq!(template_kwargs(Some(json!({"enable_thinking": false}))).unwrap().len(), 1);
        assert!(template_kwargs(None).unwrap().is_empty());
        let many: Map<String, Value> = (0..=TEMPLATE_KWARGS_MAX).map(|i| (format!("k{i}"), json!(1))).collect();
        let refused = [
            json!("enable_thinking"),
            Value::Object(many),
            json!({"messages": []}),
            json!({"k".repeat(TEMPLATE_KWARG_NAME_BYTES_MAX + 1): 1}),
            json!({"big": "x".repeat(TEMPLATE_KWARGS_BYTES_MAX)}),
        ];
        for value in refused {
            let err = template_kwargs(Some(value.clone())).unwrap_err();
            assert_eq!(err.param, Some("chat_template_kwargs"), "{value}");
        }
    }
}
