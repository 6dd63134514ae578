//! The families with committed oracle fixtures (testdata/FAMILY), shared by
//! the suites that run every one of them: a new family joins them all here.

/// Every family with a fixture, the hybrid and MLA ones included.
pub const CHECKED: &[&str] = &[
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "glm_moe_dsa",
    "kimi_k25",
    "qwen3_next",
    "qwen3_5_moe",
    "gpt_oss",
    "kimi_linear",
    "qwen4_exp",
    "deepseek_v4",
    "inkling",
    "glm5_next",
    "kimi_k3",
];
