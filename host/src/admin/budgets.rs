//! `/admin/budgets`: budgets of consumers and consumer groups, each with where its current period
//! stands (as this process's ledger counts it).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use super::store;
use crate::entity::*;
use crate::gateway::Gateway;

/// A budget and its current period.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    #[serde(flatten)]
    pub budget: Budget,
    /// USD spent in the current period: the request log's cost of the subject's requests since
    /// the period started, as counted when they ended (with a fleet: within a second).
    pub spent_usd: f64,
    /// `limit_usd − spent_usd`; below 0 once the limit was passed.
    pub remaining_usd: f64,
    /// Unix ms; 0 for `never`.
    pub period_start_ms: i64,
    /// Unix ms, when the spend starts again at 0; `null` for `never`.
    pub period_end_ms: Option<i64>,
}

fn view(g: &Gateway, budget: Budget) -> BudgetView {
    let standing = g.budgets.standing(&budget);
    BudgetView {
        budget,
        spent_usd: standing.spent_usd,
        remaining_usd: standing.remaining_usd,
        period_start_ms: standing.period_start_ms,
        period_end_ms: standing.period_end_ms,
    }
}

/// Seeds the budget's current period from the request log, unless done, so that its first view
/// says what was spent (the snapshot reload seeds it in every other process).
async fn seeded(g: &Gateway, budget: Budget) -> Result<BudgetView, ApiError> {
    let store = store(g)?;
    g.budgets.seed_one(&store.snapshot(), store, &budget).await;
    Ok(view(g, budget))
}

#[utoipa::path(get, path = "/admin/budgets", tag = "budgets",
    responses((status = 200, body = [BudgetView])))]
pub async fn list_budgets(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<BudgetView>>, ApiError> {
    let budgets = store(&g)?.config().list_budgets().await?;
    Ok(Json(budgets.into_iter().map(|b| view(&g, b)).collect()))
}

#[utoipa::path(post, path = "/admin/budgets", tag = "budgets", request_body = NewBudget,
    responses((status = 201, body = BudgetView),
        (status = 409, description = "The subject has a budget of this scope already")))]
pub async fn create_budget(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewBudget>,
) -> Result<(StatusCode, Json<BudgetView>), ApiError> {
    let budget = store(&g)?.config().create_budget(new).await?;
    Ok((StatusCode::CREATED, Json(seeded(&g, budget).await?)))
}

#[utoipa::path(get, path = "/admin/budgets/{id}", tag = "budgets",
    params(("id" = String, Path, description = "Budget id")),
    responses((status = 200, body = BudgetView), (status = 404)))]
pub async fn get_budget(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<BudgetView>, ApiError> {
    let budget = store(&g)?.config().get_budget(&id).await?;
    Ok(Json(view(&g, budget)))
}

#[utoipa::path(patch, path = "/admin/budgets/{id}", tag = "budgets",
    request_body = BudgetPatch,
    params(("id" = String, Path, description = "Budget id")),
    responses((status = 200, body = BudgetView), (status = 404)))]
pub async fn update_budget(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<BudgetPatch>,
) -> Result<Json<BudgetView>, ApiError> {
    let budget = store(&g)?.config().update_budget(&id, patch).await?;
    // A new period (`day` to `week`) is seeded like a new budget.
    Ok(Json(seeded(&g, budget).await?))
}

#[utoipa::path(delete, path = "/admin/budgets/{id}", tag = "budgets",
    params(("id" = String, Path, description = "Budget id")),
    responses((status = 204, description = "Deleted"), (status = 404)))]
pub async fn delete_budget(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_budget(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
