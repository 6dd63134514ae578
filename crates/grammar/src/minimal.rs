//! The shortest JSON value a schema accepts, written as the grammar writes
//! JSON (`", "` and `": "` separators), and the schema reading it needs:
//! what a reply out of room writes for a value it has not begun or a
//! required key it has not written. A best guess, not a proof (a `pattern`
//! or a `format` is not read): the grammar checks the text before it is
//! used (`Grammar::closing`), and `None` here means no guess (a `false`
//! schema, a `$ref` outside the schema, nesting past [`DEPTH_MAX`]).

use serde_json::{Map, Value};

/// Subschemas and `$ref`s followed before giving up: a schema that
/// requires itself has no finite value.
const DEPTH_MAX: usize = 16;

/// The most items or characters a minimal value is given (`minItems`,
/// `minLength`): past it the text is too long to be a way out.
const REPEAT_MAX: u64 = 256;

/// The shortest value of `schema`, a subschema of `root`, as JSON text.
pub(crate) fn minimal(root: &Value, schema: &Value) -> Option<String> {
    value(root, schema, DEPTH_MAX)
}

fn value(root: &Value, schema: &Value, depth: usize) -> Option<String> {
    let depth = depth.checked_sub(1)?;
    let schema = resolve(root, schema)?;
    let map = match schema {
        Value::Bool(true) => return Some("0".to_owned()),
        Value::Object(map) => map,
        _ => return None,
    };
    if let Some(constant) = map.get("const") {
        return Some(json_text(constant));
    }
    if let Some(choices) = map.get("enum").and_then(Value::as_array) {
        return choices.iter().map(json_text).min_by_key(String::len);
    }
    if let Some(branches) = map.get("anyOf").or_else(|| map.get("oneOf")).and_then(Value::as_array) {
        return branches.iter().filter_map(|branch| value(root, branch, depth)).min_by_key(String::len);
    }
    if map.contains_key("allOf") {
        return value(root, &all_of_merged(root, map)?, depth);
    }
    types(map).into_iter().filter_map(|kind| of_type(root, map, kind, depth)).min_by_key(String::len)
}

/// `schema` with its `$ref`s followed (local ones, `#/...`).
pub(crate) fn resolve<'a>(root: &'a Value, schema: &'a Value) -> Option<&'a Value> {
    let mut schema = schema;
    for _ in 0..DEPTH_MAX {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => schema = root.pointer(reference.strip_prefix('#')?)?,
            None => return Some(schema),
        }
    }
    None
}

/// The schema a value of JSON `kind` (`"object"`, `"array"`, `"string"`)
/// is held to under `schema`: its `$ref` followed, the first branch of an
/// `anyOf`/`oneOf` of that kind taken, the parts of an `allOf` merged.
/// `true` (anything) where it cannot tell.
pub(crate) fn for_kind(root: &Value, schema: &Value, kind: &str) -> Value {
    let mut schema = schema;
    for _ in 0..DEPTH_MAX {
        let Some(map) = resolve(root, schema).and_then(Value::as_object) else { break };
        let branches = map.get("anyOf").or_else(|| map.get("oneOf")).and_then(Value::as_array);
        let branch = branches.and_then(|b| {
            b.iter().find(|b| resolve(root, b).and_then(Value::as_object).is_some_and(|m| types(m).contains(&kind)))
        });
        match branch {
            Some(branch) => schema = branch,
            None if map.contains_key("allOf") => return all_of_merged(root, map).unwrap_or(Value::Bool(true)),
            None => return Value::Object(map.clone()),
        }
    }
    Value::Bool(true)
}

/// An object schema's `properties` and `allOf` parts' properties and
/// `required` lists as one schema (the parts' other keywords where the
/// schema itself does not say).
fn all_of_merged(root: &Value, map: &Map<String, Value>) -> Option<Value> {
    let mut merged = map.clone();
    let parts = merged.remove("allOf");
    for part in parts.as_ref().and_then(Value::as_array).into_iter().flatten() {
        for (key, value) in resolve(root, part)?.as_object()? {
            match (merged.get_mut(key), value) {
                (Some(Value::Object(mine)), Value::Object(theirs)) if key == "properties" => {
                    mine.extend(theirs.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                (Some(Value::Array(mine)), Value::Array(theirs)) if key == "required" => mine.extend(theirs.clone()),
                (Some(_), _) => {}
                (None, value) => {
                    merged.insert(key.clone(), value.clone());
                }
            }
        }
    }
    Some(Value::Object(merged))
}

/// The JSON types a schema allows: its `type`, or what its keywords imply.
fn types(map: &Map<String, Value>) -> Vec<&str> {
    match map.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => {
            let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
            let implied = if has(&["properties", "required", "additionalProperties", "patternProperties"]) {
                "object"
            } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
                "array"
            } else if has(&["minLength", "maxLength", "pattern", "format"]) {
                "string"
            } else if has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]) {
                "number"
            } else {
                "any"
            };
            vec![implied]
        }
    }
}

fn of_type(root: &Value, map: &Map<String, Value>, kind: &str, depth: usize) -> Option<String> {
    match kind {
        "null" => Some("null".to_owned()),
        "boolean" => Some("false".to_owned()),
        "integer" => number(map, true),
        "number" => number(map, false),
        "string" => {
            let chars = usize::try_from(bound(map, "minLength")?).ok()?;
            Some(format!("\"{}\"", "a".repeat(chars)))
        }
        "array" => {
            let items: Option<Vec<String>> =
                (0..bound(map, "minItems")?).map(|i| value(root, &item_schema(map, i), depth)).collect();
            Some(format!("[{}]", items?.join(", ")))
        }
        "object" => {
            let members: Option<Vec<String>> = required(map)
                .into_iter()
                .map(|key| Some(format!("{}: {}", quoted(&key), value(root, &property_schema(map, &key), depth)?)))
                .collect();
            Some(format!("{{{}}}", members?.join(", ")))
        }
        // Any value.
        _ => Some("0".to_owned()),
    }
}

/// A count keyword (`minItems`, `minLength`) within [`REPEAT_MAX`]; 0 when absent.
fn bound(map: &Map<String, Value>, key: &str) -> Option<u64> {
    let n = map.get(key).map_or(Some(0), Value::as_u64)?;
    (n <= REPEAT_MAX).then_some(n)
}

/// The number nearest 0 within the schema's bounds.
fn number(map: &Map<String, Value>, integer: bool) -> Option<String> {
    let get = |key: &str| map.get(key).and_then(Value::as_f64);
    let step = if integer { 1.0 } else { 0.5 };
    let low = match (get("minimum"), get("exclusiveMinimum")) {
        (Some(min), _) => Some(if integer { min.ceil() } else { min }),
        (None, Some(min)) => Some(if integer { min.floor() + step } else { min + step }),
        (None, None) => None,
    };
    let high = match (get("maximum"), get("exclusiveMaximum")) {
        (Some(max), _) => Some(if integer { max.floor() } else { max }),
        (None, Some(max)) => Some(if integer { max.ceil() - step } else { max - step }),
        (None, None) => None,
    };
    let n = match (low, high) {
        (Some(low), _) if low > 0.0 => low,
        (_, Some(high)) if high < 0.0 => high,
        _ => 0.0,
    };
    // Integers as integers (the grammar writes no `.0`), and nothing huge.
    if !n.is_finite() || n.abs() > 1e15 {
        return None;
    }
    Some(if n.fract() == 0.0 { format!("{}", n as i64) } else { format!("{n}") })
}

/// The keys an object schema requires, in the order the grammar writes
/// them: its `properties`' order, then the rest of `required`.
pub(crate) fn required(map: &Map<String, Value>) -> Vec<String> {
    let listed: Vec<&str> =
        map.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let properties = map.get("properties").and_then(Value::as_object);
    let declared = properties.into_iter().flat_map(|p| p.keys()).filter(|k| listed.contains(&k.as_str()));
    let undeclared = listed.iter().filter(|k| !properties.is_some_and(|p| p.contains_key(**k)));
    declared.map(String::to_owned).chain(undeclared.map(|k| (*k).to_owned())).collect()
}

/// The schema of an object's member `key`: its property's, or the one for
/// keys beyond them (anything when that is not a schema).
pub(crate) fn property_schema(map: &Map<String, Value>, key: &str) -> Value {
    let declared = map.get("properties").and_then(|p| p.get(key));
    let extra = map.get("additionalProperties").filter(|s| s.is_object());
    declared.or(extra).cloned().unwrap_or(Value::Bool(true))
}

/// The schema of an array's item at `index`: its `prefixItems` (or the old
/// list form of `items`), then `items` (anything when absent).
pub(crate) fn item_schema(map: &Map<String, Value>, index: u64) -> Value {
    let position = usize::try_from(index).unwrap_or(usize::MAX);
    let prefix = map.get("prefixItems").or_else(|| map.get("items").filter(|i| i.is_array()));
    let positional = prefix.and_then(Value::as_array).and_then(|list| list.get(position));
    let rest = map.get("items").filter(|i| !i.is_array());
    positional.or(rest).cloned().unwrap_or(Value::Bool(true))
}

/// `text` as a JSON string.
pub(crate) fn quoted(text: &str) -> String {
    Value::from(text).to_string()
}

/// `value` as the grammar writes JSON: `", "` between items, `": "` after keys.
pub(crate) fn json_text(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("[{}]", items.iter().map(json_text).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            let members: Vec<String> = map.iter().map(|(k, v)| format!("{}: {}", quoted(k), json_text(v))).collect();
            format!("{{{}}}", members.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn min(schema: Value) -> Option<String> {
        minimal(&schema, &schema)
    }

    #[test]
    fn required_keys_get_their_shortest_values_in_declared_order() {
        let schema = json!({"type": "object", "properties": {
            "b": {"type": "string", "minLength": 2},
            "a": {"type": "integer", "minimum": 3},
            "opt": {"type": "string"},
            "c": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
            "d": {"type": ["number", "null"], "maximum": -2.5}
        }, "required": ["a", "b", "c", "d", "e"]});
        assert_eq!(min(schema).unwrap(), r#"{"b": "aa", "a": 3, "c": [false], "d": -2.5, "e": 0}"#);
    }

    #[test]
    fn enums_consts_and_branches_give_their_shortest_choice() {
        assert_eq!(min(json!({"enum": ["fahrenheit", "celsius"]})).unwrap(), "\"celsius\"");
        assert_eq!(min(json!({"const": {"k": [1, 2]}})).unwrap(), r#"{"k": [1, 2]}"#);
        assert_eq!(min(json!({"anyOf": [{"type": "string", "minLength": 9}, {"type": "null"}]})).unwrap(), "null");
        let parts =
            json!({"allOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]}, {"required": ["y"]}]});
        assert_eq!(min(parts).unwrap(), r#"{"x": 0, "y": 0}"#);
    }

    #[test]
    fn refs_are_followed_and_a_schema_that_requires_itself_has_none() {
        let schema = json!({"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}, "required": ["n"]}},
            "type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}, "required": ["p"]});
        assert_eq!(min(schema).unwrap(), r#"{"p": {"n": 1}}"#);
        let endless = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"});
        assert_eq!(min(endless), None);
        assert_eq!(min(json!(false)), None);
        assert_eq!(min(json!({"type": "array", "minItems": 100_000})), None);
    }

    #[test]
    fn a_branch_of_the_kind_written_is_the_schema_it_is_held_to() {
        let schema = json!({"anyOf": [{"type": "string"}, {"$ref": "#/$defs/o"}], "$defs": {"o": {"type": "object", "required": ["k"]}}});
        assert_eq!(for_kind(&schema, &schema, "object"), json!({"type": "object", "required": ["k"]}));
        assert_eq!(for_kind(&schema, &schema, "string"), json!({"type": "string"}));
    }
}
