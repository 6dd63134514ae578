//! Tools and structured outputs as both APIs ask for them: the tools offered
//! (OpenAI function objects, which the chat template renders), whether and
//! which call is forced, and the reply's format; and the grammar that holds
//! the reply to them.

use serde_json::Value;
use strata_engine::{Constraint, Finish};
use strata_grammar::GrammarCompiler;
use strata_text::{Message, ToolCallParser};

use crate::error::ApiError;
use crate::state::App;

/// Whether the model may, must, or must not call a tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Tools are shown, but the answer is read as text only.
    None,
    #[default]
    Auto,
    /// One call of any tool (OpenAI's `required`, Anthropic's `any`).
    Required,
    /// One call of this function.
    Named(String),
}

/// The shape the reply must take.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Format {
    #[default]
    Text,
    JsonObject,
    /// A schema, and whether it is read as strict (`json_schema.strict`:
    /// objects that leave extra keys unsaid allow none).
    JsonSchema {
        schema: Value,
        strict: bool,
    },
}

/// What a request asks of tools and formats, in terms both APIs share.
#[derive(Debug, Clone, Default)]
pub struct Structure {
    /// OpenAI tool objects: `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub format: Format,
}

/// A tool object's function name, if it has one.
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool["function"]["name"].as_str()
}

/// The function of the call `id` made earlier in `conversation` (a result
/// names it for templates that print it; neither API's result carries it).
pub fn called_function(conversation: &[Message], id: &str) -> String {
    conversation.iter().flat_map(|m| &m.tool_calls).find(|c| c.id == id).map(|c| c.name.clone()).unwrap_or_default()
}

/// Said beside a reply held to a grammar that `max_tokens` (or the
/// context's end) cut before it could close: near the limit the engine
/// forces the shortest completion the grammar knows, so a reply cut all the
/// same had no room even for that, or a schema nested past what the
/// completion holds. The reply is then the raw text, as far as it got.
const CUT_BEFORE_CLOSING: &str = "the reply is held to a grammar (a forced tool call or a JSON response format) \
     and max_tokens cut it before its shortest completion fitted: the text is incomplete; raise max_tokens, or \
     bound the schema's strings and nesting";

/// The note for a reply that ended at `reason`, held to a grammar or not,
/// with calls that parsed or not.
pub fn cut_note(held: bool, reason: Finish, called: bool) -> Option<&'static str> {
    (held && reason == Finish::Length && !called).then_some(CUT_BEFORE_CLOSING)
}

impl Structure {
    /// Refuses tools without a name and a forced call of a tool not offered
    /// (400s naming the field).
    pub fn check(&self) -> Result<(), ApiError> {
        if let Some(index) = self.tools.iter().position(|t| t["type"] != "function" || tool_name(t).is_none()) {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "tools[{index}] is not a function tool with a name (`{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}`)"
                ),
            ));
        }
        match &self.choice {
            ToolChoice::Required if self.tools.is_empty() => {
                Err(ApiError::invalid_param("tool_choice", "a tool call is required, but no tools are given"))
            }
            ToolChoice::Named(name) if !self.tools.iter().any(|t| tool_name(t) == Some(name)) => {
                Err(ApiError::invalid_param("tool_choice", format!("no tool named `{name}` is given in tools")))
            }
            _ => Ok(()),
        }
    }

    /// Whether the answer is read for calls.
    pub fn reads_calls(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

impl App {
    /// The grammar compiler over this model's vocabulary, built on first
    /// use (the token trie of a large vocabulary takes a second or more).
    fn grammars(&self) -> Result<&GrammarCompiler, ApiError> {
        self.grammars
            .get_or_init(|| GrammarCompiler::new(&self.tokenizer, &self.eos_token_ids).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| ApiError::internal(format!("building the grammar compiler: {e}")))
    }

    /// The grammar a request's reply is held to, if any: a forced call wins
    /// over a response format.
    pub fn constraint(&self, structure: &Structure) -> Result<Option<Box<dyn Constraint>>, ApiError> {
        let (param, grammar) = match (&structure.choice, &structure.format) {
            (ToolChoice::Required, _) => {
                ("tools", self.grammars()?.tool_call(self.tool_syntax, &structure.tools, None))
            }
            (ToolChoice::Named(name), _) => {
                ("tools", self.grammars()?.tool_call(self.tool_syntax, &structure.tools, Some(name)))
            }
            (_, Format::JsonObject) => ("response_format", self.grammars()?.json_object()),
            (_, Format::JsonSchema { schema, strict }) => {
                ("response_format", self.grammars()?.json_schema(schema, *strict))
            }
            (_, Format::Text) => return Ok(None),
        };
        match grammar {
            Ok(grammar) => Ok(Some(Box::new(grammar))),
            Err(strata_grammar::Error::InvalidRequest(message)) => Err(ApiError::invalid_param(param, message)),
            Err(e) => Err(ApiError::internal(e.to_string())),
        }
    }

    /// The parser that reads a reply's calls, when it may hold any.
    pub fn call_parser(&self, structure: &Structure) -> Option<ToolCallParser> {
        structure.reads_calls().then(|| ToolCallParser::new(self.tool_syntax, &structure.tools))
    }
}
