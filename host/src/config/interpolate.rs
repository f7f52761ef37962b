//! `${VAR}` and `${VAR:-default}` interpolation over the raw config text.
//!
//! Interpolating the text (not the parsed tree) keeps line numbers in parse errors true. Full-line
//! comments are left alone so documentation such as `# set ${SIM_KEY}` never demands a variable.

/// A `${VAR}` without a default whose variable is not set.
#[derive(Debug, PartialEq)]
pub struct MissingVariable {
    pub line: usize,
    pub var: String,
}

pub fn interpolate(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, MissingVariable> {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') || !line.contains("${") {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                // No closing brace: not an interpolation, keep the text as written.
                out.push_str(&rest[start..]);
                rest = "";
                break;
            };
            let expr = &after[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n.trim(), Some(d)),
                None => (expr.trim(), None),
            };
            match env(name).filter(|v| !(v.is_empty() && default.is_some())) {
                Some(value) => out.push_str(&value),
                None => match default {
                    Some(d) => out.push_str(d),
                    None => {
                        return Err(MissingVariable {
                            line: i + 1,
                            var: name.to_owned(),
                        });
                    }
                },
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn substitutes_set_variables_and_defaults() {
        let out = interpolate(
            "a: ${SET}\nb: ${UNSET:-dflt}\nc: ${EMPTY:-x}\nd: ${UNSET:-}\n",
            &env,
        )
        .unwrap();
        assert_eq!(out, "a: value\nb: dflt\nc: x\nd: \n");
    }

    #[test]
    fn missing_variable_reports_its_line() {
        let err = interpolate("a: 1\nb: ${NOPE}\n", &env).unwrap_err();
        assert_eq!(
            err,
            MissingVariable {
                line: 2,
                var: "NOPE".into()
            }
        );
    }

    #[test]
    fn comments_and_unclosed_braces_are_left_alone() {
        let text = "# needs ${NOPE}\nx: \"${oops\"\n";
        assert_eq!(interpolate(text, &env).unwrap(), text);
    }
}
