//! The newsletter's tables, in the schema `news` (Hexeract's are beside them, in `hexeract`).

use sqlx::PgPool;

/// Creates the newsletter's tables if they are missing.
pub(crate) async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    for statement in TABLES {
        sqlx::query(statement).execute(pool).await?;
    }
    Ok(())
}

const TABLES: [&str; 4] = [
    "CREATE SCHEMA IF NOT EXISTS news",
    "CREATE TABLE IF NOT EXISTS news.subscribers (
         id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         email text NOT NULL UNIQUE,
         joined_at timestamptz NOT NULL DEFAULT now(),
         confirmed_at timestamptz
     )",
    // One row per welcome mail, keyed by the id of the message that asked for it.
    "CREATE TABLE IF NOT EXISTS news.outgoing_mail (
         message_id uuid PRIMARY KEY,
         to_address text NOT NULL,
         subject text NOT NULL,
         queued_at timestamptz NOT NULL DEFAULT now()
     )",
    "CREATE TABLE IF NOT EXISTS news.daily_signups (
         day date PRIMARY KEY,
         signups bigint NOT NULL
     )",
];
