//! JSON bridge for the differential test against the reference implementation
//! (`tests/oracle/differential.py`). Ignored by default; the script runs it with
//! `ROUTEWISE_ORACLE_IN` (cases) and `ROUTEWISE_ORACLE_OUT` (results) set.
//!
//! A case is `{"costs": [..], "ttft_ms": [..], "alpha": a}` and its result
//! `{"status": "...", "budget": B, "weights": [..], "expected_cost": x, "objective": [..]}`, where
//! `objective` is the tie-broken objective the LP minimised.

use serde_json::{Value, json};
use strategy_routewise::lp;

fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "run by tests/oracle/differential.py"]
fn differential_oracle_io() -> Result<(), String> {
    let (Ok(input), Ok(output)) = (
        std::env::var("ROUTEWISE_ORACLE_IN"),
        std::env::var("ROUTEWISE_ORACLE_OUT"),
    ) else {
        return Err("set ROUTEWISE_ORACLE_IN and ROUTEWISE_ORACLE_OUT".to_owned());
    };
    let text = std::fs::read_to_string(&input).map_err(|e| format!("{input}: {e}"))?;
    let cases: Vec<Value> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let results: Vec<Value> = cases
        .iter()
        .map(|case| {
            let costs = floats(&case["costs"]);
            let ttft = floats(&case["ttft_ms"]);
            let alpha = case["alpha"].as_f64().unwrap_or(f64::NAN);
            let plan = lp::plan(&costs, &ttft, alpha);
            json!({
                "status": plan.status.as_str(),
                "budget": plan.budget,
                "weights": plan.weights,
                "expected_cost": plan.expected_cost,
                "objective": lp::tiebroken_objective(&ttft, &costs),
            })
        })
        .collect();
    std::fs::write(&output, Value::Array(results).to_string())
        .map_err(|e| format!("{output}: {e}"))?;
    Ok(())
}
