//! Schemas read as strict: an object schema that does not say whether keys
//! beyond its `properties` are allowed allows none. JSON Schema's default
//! is to allow any, which under a grammar lets a model write undeclared
//! keys until `max_tokens` (a forced call that never closes); vLLM's and
//! SGLang's grammar backends and llama.cpp's schema converter close them
//! the same way when they constrain.

use serde_json::{Map, Value};

/// Keywords whose value is one schema.
const SCHEMA_KEYWORDS: [&str; 10] = [
    "additionalProperties",
    "additionalItems",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAP_KEYWORDS: [&str; 5] = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];

/// `schema` with `"additionalProperties": false` on every object schema
/// that sets neither it nor `unevaluatedProperties`. Left open: a schema
/// that combines subschemas (`allOf`, `anyOf`, `oneOf`) itself, the
/// branches of an `allOf` (parts of one object, which closing would make
/// disjoint), and the branches of an `anyOf`/`oneOf` whose parent declares
/// properties (the same). Values that are data (`enum`, `const`,
/// `default`, `examples`) are not schemas and stay as written.
///
/// Recursion follows the schema's nesting, which the JSON parser bounds
/// (serde_json refuses input nested deeper than 128).
pub(super) fn closed_objects(schema: &Value) -> Value {
    close(schema, true)
}

fn close(schema: &Value, close_self: bool) -> Value {
    let Value::Object(map) = schema else {
        // `true`, `false`, or no schema at all: nothing to close.
        return schema.clone();
    };
    let mut closed = Map::with_capacity(map.len() + 1);
    let declares_properties = map.contains_key("properties");
    for (key, value) in map {
        let value = match key.as_str() {
            k if SCHEMA_KEYWORDS.contains(&k) => match value {
                // `items` as a list is the old spelling of `prefixItems`.
                Value::Array(list) => Value::Array(list.iter().map(|s| close(s, true)).collect()),
                one => close(one, true),
            },
            k if SCHEMA_MAP_KEYWORDS.contains(&k) => match value {
                Value::Object(named) => {
                    Value::Object(named.iter().map(|(name, s)| (name.clone(), close(s, true))).collect())
                }
                other => other.clone(),
            },
            "prefixItems" => each(value, true),
            "allOf" => each(value, false),
            "anyOf" | "oneOf" => each(value, !declares_properties),
            _ => value.clone(),
        };
        closed.insert(key.clone(), value);
    }
    if close_self && is_open_object(map) {
        closed.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    Value::Object(closed)
}

/// Each schema of a list keyword, closed at its own level when `close_self`.
fn each(list: &Value, close_self: bool) -> Value {
    match list {
        Value::Array(schemas) => Value::Array(schemas.iter().map(|s| close(s, close_self)).collect()),
        other => other.clone(),
    }
}

/// An object schema (by `type` or by its `properties`) that leaves extra
/// keys unsaid and combines no subschemas.
fn is_open_object(map: &Map<String, Value>) -> bool {
    let is_object = match map.get("type") {
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "object"),
        _ => map.contains_key("properties"),
    };
    let says_extra_keys = map.contains_key("additionalProperties") || map.contains_key("unevaluatedProperties");
    let combines = ["allOf", "anyOf", "oneOf"].iter().any(|k| map.contains_key(*k));
    is_object && !says_extra_keys && !combines
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nested_objects_without_additional_properties_are_closed() {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "where": {"properties": {"lat": {"type": "number"}}},
            "stops": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "pair": {"prefixItems": [{"type": "object"}, {"type": "string"}]},
            "ref": {"$ref": "#/$defs/place"}
        }, "$defs": {"place": {"type": ["object", "null"], "properties": {"id": {"type": "integer"}}}}});
        let closed = closed_objects(&schema);
        for pointer in
            ["", "/properties/where", "/properties/stops/items", "/properties/pair/prefixItems/0", "/$defs/place"]
        {
            assert_eq!(closed.pointer(&format!("{pointer}/additionalProperties")), Some(&json!(false)), "{pointer}");
        }
        assert_eq!(closed["properties"]["city"], json!({"type": "string"}));
        assert_eq!(closed["properties"]["ref"], json!({"$ref": "#/$defs/place"}));
    }

    #[test]
    fn what_a_schema_says_about_extra_keys_is_kept() {
        let schema = json!({"type": "object", "properties": {
            "open": {"type": "object", "additionalProperties": true},
            "typed": {"type": "object", "additionalProperties": {"type": "object"}},
            "later": {"type": "object", "unevaluatedProperties": false}
        }});
        let closed = closed_objects(&schema);
        assert_eq!(closed["properties"]["open"]["additionalProperties"], json!(true));
        // A schema for the extra keys' values is itself closed.
        assert_eq!(
            closed["properties"]["typed"]["additionalProperties"],
            json!({"type": "object", "additionalProperties": false})
        );
        assert!(closed["properties"]["later"].get("additionalProperties").is_none());
    }

    #[test]
    fn combined_schemas_are_closed_only_where_each_branch_is_whole() {
        let branch = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let schema = json!({
            "properties": {
                "parts": {"allOf": [branch.clone(), {"properties": {"b": {"type": "string"}}}]},
                "either": {"anyOf": [branch.clone(), {"type": "string"}]},
                "shared": {"properties": {"kind": {"type": "string"}}, "oneOf": [branch.clone()]}
            }
        });
        let closed = closed_objects(&schema);
        assert_eq!(closed["properties"]["parts"]["allOf"][0], branch);
        assert!(closed["properties"]["parts"].get("additionalProperties").is_none());
        assert_eq!(closed["properties"]["either"]["anyOf"][0]["additionalProperties"], json!(false));
        assert_eq!(closed["properties"]["shared"]["oneOf"][0], branch);
        assert!(closed["properties"]["shared"].get("additionalProperties").is_none());
    }

    #[test]
    fn data_keywords_are_not_read_as_schemas() {
        let schema = json!({"type": "object", "properties": {"p": {
            "const": {"type": "object", "properties": {}},
            "enum": [{"type": "object"}],
            "default": {"type": "object"}
        }}});
        let closed = closed_objects(&schema);
        assert_eq!(closed["properties"]["p"], schema["properties"]["p"]);
    }
}
