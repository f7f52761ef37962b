//! Calls a strategy does without ([`Strategy::SKIPS`](crate::Strategy::SKIPS)).

/// Calls the host may leave out for this strategy, declared in [`Strategy::SKIPS`](crate::Strategy::SKIPS)
/// and stamped by [`export_strategy!`](crate::export_strategy) into the component's custom section
/// `switchyard-router-skips`.
///
/// Each call into a strategy costs the host microseconds whatever the strategy does with it; on a
/// model with one upstream, `select` and `observe` of a strategy that needs neither were a tenth of
/// the gateway's work per request. A declaration is a promise the host trusts on the request path:
/// declare only what holds for every model and params. `switchyard strategies test` checks
/// [`Skips::select_single`] against the component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skips {
    observe: bool,
    tick: bool,
    select_single: bool,
}

impl Skips {
    /// Every call is made (the default).
    pub const NONE: Skips = Skips {
        observe: false,
        tick: false,
        select_single: false,
    };

    /// [`Strategy::observe`](crate::Strategy::observe) does nothing: the host does not report
    /// finished attempts.
    pub const fn observe(mut self) -> Self {
        self.observe = true;
        self
    }

    /// [`Strategy::tick`](crate::Strategy::tick) does nothing: the host does not tick.
    pub const fn tick(mut self) -> Self {
        self.tick = true;
        self
    }

    /// With exactly one candidate, [`Strategy::select`](crate::Strategy::select) orders that
    /// candidate alone, with no hedge and empty metadata, and changes no state: the host answers so
    /// without calling it.
    pub const fn select_single(mut self) -> Self {
        self.select_single = true;
        self
    }

    /// The section's text: the declared words separated by spaces.
    const fn words(self) -> ([&'static str; 3], usize) {
        let mut words = [""; 3];
        let mut n = 0;
        if self.observe {
            words[n] = "observe";
            n += 1;
        }
        if self.tick {
            words[n] = "tick";
            n += 1;
        }
        if self.select_single {
            words[n] = "select-single";
            n += 1;
        }
        (words, n)
    }

    /// Length of the section's text in bytes.
    #[doc(hidden)]
    pub const fn section_len(self) -> usize {
        let (words, n) = self.words();
        let mut len = 0;
        let mut i = 0;
        while i < n {
            len += words[i].len() + if i > 0 { 1 } else { 0 };
            i += 1;
        }
        len
    }

    /// The section's text as bytes; `N` is [`Self::section_len`].
    #[doc(hidden)]
    pub const fn section<const N: usize>(self) -> [u8; N] {
        let (words, n) = self.words();
        let mut bytes = [0; N];
        let mut at = 0;
        let mut i = 0;
        while i < n {
            if i > 0 {
                bytes[at] = b' ';
                at += 1;
            }
            let word = words[i].as_bytes();
            let mut j = 0;
            while j < word.len() {
                bytes[at] = word[j];
                at += 1;
                j += 1;
            }
            i += 1;
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_lists_the_declared_words() {
        assert_eq!(Skips::NONE.section_len(), 0);
        assert_eq!(Skips::NONE.section::<0>(), [0u8; 0]);
        assert_eq!(&Skips::NONE.tick().section::<4>(), b"tick");
        let all = Skips::NONE.select_single().observe().tick();
        assert_eq!(all.section_len(), "observe tick select-single".len());
        assert_eq!(&all.section::<26>(), b"observe tick select-single");
        let two = Skips::NONE.observe().select_single();
        assert_eq!(two.section_len(), 21);
        assert_eq!(&two.section::<21>(), b"observe select-single");
    }
}
