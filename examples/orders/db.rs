//! The shop's own tables, in the schema `shop` of the database `DATABASE_URL` names (Hexeract's
//! tables are beside them, in the schema `hexeract`).

use sqlx::PgPool;

/// Creates the shop's tables if they are missing and stocks the catalogue on first start.
/// Several replicas may start at once: an advisory lock lets one of them do it.
pub(crate) async fn migrate(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('shop.migrate'))")
        .execute(&mut *tx)
        .await?;
    for statement in SCHEMA {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    tx.commit().await
}

const SCHEMA: [&str; 8] = [
    "CREATE SCHEMA IF NOT EXISTS shop",
    "CREATE TABLE IF NOT EXISTS shop.products (
         sku text PRIMARY KEY,
         name text NOT NULL,
         price_cents bigint NOT NULL CHECK (price_cents > 0),
         in_stock integer NOT NULL CHECK (in_stock >= 0)
     )",
    "INSERT INTO shop.products (sku, name, price_cents, in_stock) VALUES
         ('mug', 'Hexeract mug', 1200, 10),
         ('tshirt', 'Hexeract t-shirt', 2500, 3),
         ('sticker', 'Hexeract sticker', 300, 100)
     ON CONFLICT (sku) DO NOTHING",
    "CREATE TABLE IF NOT EXISTS shop.carts (
         id uuid PRIMARY KEY,
         created_at timestamptz NOT NULL DEFAULT now(),
         updated_at timestamptz NOT NULL DEFAULT now()
     )",
    "CREATE TABLE IF NOT EXISTS shop.cart_items (
         cart_id uuid NOT NULL REFERENCES shop.carts (id) ON DELETE CASCADE,
         sku text NOT NULL REFERENCES shop.products (sku),
         quantity integer NOT NULL CHECK (quantity > 0),
         PRIMARY KEY (cart_id, sku)
     )",
    "CREATE TABLE IF NOT EXISTS shop.orders (
         id uuid PRIMARY KEY,
         email text NOT NULL,
         total_cents bigint NOT NULL,
         status text NOT NULL,
         status_detail text,
         placed_at timestamptz NOT NULL DEFAULT now(),
         updated_at timestamptz NOT NULL DEFAULT now()
     )",
    "CREATE TABLE IF NOT EXISTS shop.order_lines (
         order_id uuid NOT NULL REFERENCES shop.orders (id),
         sku text NOT NULL REFERENCES shop.products (sku),
         quantity integer NOT NULL,
         price_cents bigint NOT NULL,
         PRIMARY KEY (order_id, sku)
     )",
    // The mail the shop sent. A real shop hands mail to a provider; the message id goes with it
    // as the idempotency key, and here it is the primary key, so a mail is never sent twice.
    "CREATE TABLE IF NOT EXISTS shop.outgoing_mail (
         message_id uuid PRIMARY KEY,
         order_id uuid NOT NULL REFERENCES shop.orders (id),
         to_address text NOT NULL,
         subject text NOT NULL,
         sent_at timestamptz NOT NULL DEFAULT now()
     )",
];
