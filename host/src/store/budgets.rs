//! Budgets (`budgets`): the table, and the [`BudgetStore`] part of [`super::ConfigStore`].

use async_trait::async_trait;

use super::StoreError;
use super::table::{Word, not_found, table};
use crate::entity::{Budget, BudgetPatch, NewBudget};

table! {
    /// A `budgets` row.
    BudgetRow: Budget = "budgets" {
        id: String,
        scope: String = Word,
        subject: String,
        period: String = Word,
        mode: String = Word,
        limit_usd: f64,
        created_at_ms: i64,
        updated_at_ms: i64,
    }
}

/// Budgets; part of every [`super::ConfigStore`]. A consumer's budgets are deleted with it.
#[async_trait]
pub trait BudgetStore: Send + Sync {
    async fn list_budgets(&self) -> Result<Vec<Budget>, StoreError>;
    async fn get_budget(&self, id: &str) -> Result<Budget, StoreError>;
    /// A consumer subject must exist (else 422 on `subject`); one budget per (scope, subject)
    /// (else a conflict on `subject`).
    async fn create_budget(&self, new: NewBudget) -> Result<Budget, StoreError>;
    async fn update_budget(&self, id: &str, patch: BudgetPatch) -> Result<Budget, StoreError>;
    async fn delete_budget(&self, id: &str) -> Result<(), StoreError>;
}

pub(crate) fn budget_not_found(id: &str) -> StoreError {
    not_found("budget", id)
}

pub(crate) fn budget_conflict(budget: &Budget) -> StoreError {
    super::table::conflict(
        "subject",
        format!(
            "subject: a budget for {} `{}` exists",
            budget.scope.as_str(),
            budget.subject
        ),
    )
}

/// Implements [`BudgetStore`] for `$store` over `$db`, inside `impl_config_store!` (whose helpers
/// it uses).
macro_rules! impl_budget_store {
    ($store:ty, $db:ty) => {
        mod budgets {
            use super::*;
            use $crate::entity::{Budget, BudgetPatch, BudgetScope, NewBudget, generate_id};
            use $crate::store::budgets::*;
            use $crate::store::table::unique_or;

            fn now_ms() -> i64 {
                i64::try_from($crate::clock::unix_ms()).unwrap_or(i64::MAX)
            }

            impl $store {
                async fn budget_in(&self, conn: &mut Conn, id: &str) -> Result<Budget, StoreError> {
                    self.find::<BudgetRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| budget_not_found(id))
                }
            }

            #[async_trait::async_trait]
            impl BudgetStore for $store {
                async fn list_budgets(&self) -> Result<Vec<Budget>, StoreError> {
                    self.list::<BudgetRow>("ORDER BY created_at_ms, id", &[])
                        .await
                }

                async fn get_budget(&self, id: &str) -> Result<Budget, StoreError> {
                    self.budget_in(&mut *self.conn().await?, id).await
                }

                async fn create_budget(&self, new: NewBudget) -> Result<Budget, StoreError> {
                    let budget = new.into_budget(generate_id("bg"), now_ms())?;
                    let (mut tx, version) = self.begin_write().await?;
                    if budget.scope == BudgetScope::Consumer {
                        self.require_ref(
                            &mut tx,
                            "consumers",
                            "subject",
                            "consumer",
                            &budget.subject,
                        )
                        .await?;
                    }
                    write::<BudgetRow>(&mut tx, &BudgetRow::insert(), &budget)
                        .await
                        .map_err(|e| unique_or(BACKEND, e, || budget_conflict(&budget)))?;
                    self.commit(tx, version).await?;
                    Ok(budget)
                }

                async fn update_budget(
                    &self,
                    id: &str,
                    patch: BudgetPatch,
                ) -> Result<Budget, StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    let mut budget = self.budget_in(&mut tx, id).await?;
                    patch.apply(&mut budget, now_ms())?;
                    write::<BudgetRow>(&mut tx, &BudgetRow::update(), &budget)
                        .await
                        .map_err(|e| self.db_error(e))?;
                    self.commit(tx, version).await?;
                    Ok(budget)
                }

                async fn delete_budget(&self, id: &str) -> Result<(), StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    if !delete_row(&mut tx, "DELETE FROM budgets WHERE id = $1", &[id])
                        .await
                        .map_err(|e| self.db_error(e))?
                    {
                        return Err(budget_not_found(id));
                    }
                    self.commit(tx, version).await
                }
            }
        }
    };
}

pub(crate) use impl_budget_store;
