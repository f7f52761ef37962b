use super::*;

#[test]
fn estimate_counts_system_messages_tool_results_and_images() {
    let mut r = Request::new(
        "m",
        Dialect::OpenAiChat,
        vec![
            Message::text(Role::System, "abcd"),
            Message {
                role: Role::User,
                content: vec![
                    Part::text("abcdefgh"),
                    Part::Image {
                        source: ImageSource::from_url("https://x/y.png"),
                        detail: None,
                        cache_control: None,
                    },
                ],
                name: None,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult(ToolResult {
                    tool_call_id: "c".into(),
                    content: vec![Part::text("abcd")],
                    is_error: false,
                    cache_control: None,
                })],
                name: None,
            },
        ],
    );
    assert_eq!(r.prompt_token_estimate(), 4 + 85);
    assert_eq!(r.modalities(), Modalities::IMAGE);
    r.messages.push(Message {
        role: Role::User,
        content: vec![
            Part::Audio {
                data: "AA".into(),
                format: "wav".into(),
            },
            Part::Video {
                url: "https://v".into(),
            },
        ],
        name: None,
    });
    assert_eq!(
        r.modalities(),
        Modalities::IMAGE | Modalities::AUDIO | Modalities::VIDEO
    );
}

#[test]
fn data_urls_round_trip() {
    let s = ImageSource::from_url("data:image/png;base64,AAAA");
    assert_eq!(
        s,
        ImageSource::Base64 {
            media_type: "image/png".into(),
            data: "AAAA".into()
        }
    );
    assert_eq!(s.to_url(), "data:image/png;base64,AAAA");
    assert_eq!(
        ImageSource::from_url("data:,notbase64"),
        ImageSource::Url("data:,notbase64".into())
    );
}

#[test]
fn effort_and_budget_map_back_and_forth() {
    for e in [Effort::Low, Effort::Medium, Effort::High] {
        let b = e.budget_tokens().unwrap();
        assert_eq!(Effort::from_budget(b), e);
    }
    assert_eq!(Effort::None.budget_tokens(), None);
    let r = Reasoning {
        budget_tokens: Some(5000),
        ..Default::default()
    };
    assert_eq!(r.effective_effort(), Some(Effort::Medium));
}

/// Characters, not bytes: an ASCII text is counted by its length, any other character by character.
#[test]
fn the_estimate_counts_characters_whatever_their_bytes() {
    for (text, chars) in [
        ("", 0),
        ("abcdefgh", 8),
        ("café crème", 10),
        ("日本語のテキスト", 8),
        ("🙂🙂🙂🙂", 4),
    ] {
        assert_eq!(char_count(text), chars, "{text}");
        assert_eq!(char_count(text), text.chars().count(), "{text}");
    }
    let r = Request::new(
        "m",
        Dialect::OpenAiChat,
        vec![Message::text(Role::User, "日本語のテキスト")],
    );
    assert_eq!(r.prompt_token_estimate(), 2);
}
