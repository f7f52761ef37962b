use super::*;

/// A user's or assistant's text message read off its text is the message its tree makes; other
/// roles and a `name` are declined, and read as trees.
#[test]
fn plain_messages_read_as_their_trees_do() {
    for raw in [
        r#"{"role":"user","content":"caf\u00e9"}"#,
        r#"{"content":"a","role":"assistant"}"#,
    ] {
        let plain = json::PlainMessage::read(raw).expect(raw);
        let tree: Value = serde_json::from_str(raw).unwrap();
        let mut out = Vec::new();
        message(0, &tree, &mut out).unwrap();
        assert_eq!(plain_message(plain).map(|m| vec![m]), Some(out), "{raw}");
    }
    for declined in [
        r#"{"role":"system","content":"s"}"#,
        r#"{"role":"user","content":"x","name":"n"}"#,
    ] {
        let plain = json::PlainMessage::read(declined).expect(declined);
        assert_eq!(plain_message(plain), None, "{declined}");
    }
    let r = parse_request(
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x","name":"n"},{"role":"assistant","content":"y"}]}"#,
    )
    .unwrap();
    assert_eq!(r.messages.len(), 2);
    let refused = parse_request(
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"system","content":"s"}]}"#,
    )
    .unwrap_err();
    assert!(
        refused.to_string().contains("must be user or assistant"),
        "{refused}"
    );
}

fn build(r: &Request) -> Value {
    serde_json::from_slice(&build_request(r, "claude")).unwrap()
}

#[test]
fn tool_results_split_into_a_tool_message_and_merge_back() {
    let body = br#"{"model":"m","max_tokens":10,"messages":[
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"w","input":{"c":"P"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"},{"type":"text","text":"thanks"}]}]}"#;
    let r = parse_request(body).unwrap();
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool, Role::User]);
    let b = build(&r);
    assert_eq!(b["messages"].as_array().unwrap().len(), 3);
    assert_eq!(b["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(b["messages"][2]["content"][1]["text"], "thanks");
    assert_eq!(b["messages"][1]["content"][0]["input"], json!({"c": "P"}));
}

#[test]
fn thinking_budget_fits_under_max_tokens() {
    let mut r = parse_request(
        br#"{"model":"m","max_tokens":2000,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":4000}}"#,
    )
    .unwrap();
    assert_eq!(build(&r)["thinking"]["budget_tokens"], 1999);
    r.max_output_tokens = None;
    let b = build(&r);
    assert_eq!(b["thinking"]["budget_tokens"], 4000);
    assert_eq!(b["max_tokens"], DEFAULT_MAX_TOKENS);
    r.reasoning = Some(Reasoning {
        budget_tokens: Some(10_000),
        ..Default::default()
    });
    let b = build(&r);
    assert_eq!(b["thinking"]["budget_tokens"], 10_000);
    assert_eq!(b["max_tokens"], 10_000 + DEFAULT_MAX_TOKENS);
    r.max_output_tokens = Some(500);
    assert!(build(&r).get("thinking").is_none());
}

#[test]
fn unknown_thinking_modes_pass_through_to_anthropic_only() {
    let r = parse_request(
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"adaptive"},"service_tier":"auto"}"#,
    )
    .unwrap();
    assert!(r.reasoning.is_none());
    let b = build(&r);
    assert_eq!(b["thinking"]["type"], "adaptive");
    assert_eq!(b["service_tier"], "auto");
}

#[test]
fn rejects_blocks_it_cannot_translate() {
    for (body, reason) in [
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
            "`max_tokens` is required",
        ),
        (
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#,
            "`messages[0].content[0].type` `document` is not supported",
        ),
        (
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}"#,
            "not supported in a user message",
        ),
        (
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
            "only client tools",
        ),
        (
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}"#,
            "must be user or assistant",
        ),
    ] {
        let err = parse_request(body.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(reason), "{err} should contain {reason}");
    }
}
