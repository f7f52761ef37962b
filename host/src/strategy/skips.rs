//! Calls a strategy declares it does without, so the host does not make them.
//!
//! Every call into a guest costs the host thousands of instructions whatever the guest does with
//! it (the instance's lock, a fiber, lowering and lifting the arguments): for `fixed` on a model
//! with one upstream, `select` and `observe` were ~10 % of a request's instructions, to learn an
//! order that could only be the one candidate and to report an attempt nobody reads. A strategy
//! lists such calls in the custom section [`SKIPS_SECTION`]; a component without it gets every call.

/// Name of the custom section holding the words of [`SkippedCalls`], separated by spaces or commas.
pub const SKIPS_SECTION: &str = "switchyard-router-skips";

/// What the host may leave out for one strategy. The declaration is the strategy's promise: the
/// host does not check it on the request path (`switchyard strategies test` does, for `select`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkippedCalls {
    /// `observe`: the strategy learns nothing from finished attempts.
    pub observe: bool,
    /// `tick`: the strategy keeps no time-based state.
    pub tick: bool,
    /// `select-single`: with one candidate, `select` answers that candidate, with no hedge and
    /// empty metadata, and changes no state; the host answers for it.
    pub select_single: bool,
}

/// The words of the section, in the order they are listed.
const WORDS: [&str; 3] = ["observe", "tick", "select-single"];

impl SkippedCalls {
    /// Reads the section's text. An unknown word is an error (a typo would otherwise cost the
    /// strategy's author the saving without a word), naming the words the host knows.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut skips = SkippedCalls::default();
        for word in text.split([' ', ',', '\n', '\t']).filter(|w| !w.is_empty()) {
            match word {
                "observe" => skips.observe = true,
                "tick" => skips.tick = true,
                "select-single" => skips.select_single = true,
                _ => {
                    return Err(format!(
                        "custom section {SKIPS_SECTION} names {word:?}, which is not a call the host can skip (known: {})",
                        WORDS.join(", ")
                    ));
                }
            }
        }
        Ok(skips)
    }

    /// The declared words, for health endpoints and `strategies list`.
    pub fn words(&self) -> Vec<&'static str> {
        let declared = [self.observe, self.tick, self.select_single];
        WORDS
            .into_iter()
            .zip(declared)
            .filter_map(|(word, on)| on.then_some(word))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_read_in_any_order_and_separation() {
        let skips = SkippedCalls::parse(" tick,select-single\nobserve ").unwrap();
        assert_eq!(
            skips,
            SkippedCalls {
                observe: true,
                tick: true,
                select_single: true
            }
        );
        assert_eq!(skips.words(), ["observe", "tick", "select-single"]);
        assert_eq!(SkippedCalls::parse("").unwrap(), SkippedCalls::default());
        assert_eq!(
            SkippedCalls::parse("observe").unwrap(),
            SkippedCalls {
                observe: true,
                ..Default::default()
            }
        );
    }

    #[test]
    fn an_unknown_word_is_refused_with_the_known_ones() {
        let err = SkippedCalls::parse("observe selct-single").unwrap_err();
        assert!(err.contains("\"selct-single\""), "{err}");
        assert!(err.contains("known: observe, tick, select-single"), "{err}");
        assert!(err.contains(SKIPS_SECTION), "{err}");
    }
}
