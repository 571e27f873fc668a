//! `examples/orders` as a user runs it: the binary against PostgreSQL and RabbitMQ, driven
//! through its HTTP API. A checkout becomes a confirmed order (stock reserved, one mail), an
//! order that is short of stock is rejected without touching stock, a confirmation to an
//! undeliverable address ends in the dead letters (seen through the binary's own
//! `dead-letters list`), a redelivered `OrderPlaced` changes nothing, a stale cart expires, and
//! SIGTERM stops the binary with exit code 0.
//!
//! Needs the example built (`cargo build --example orders`; `scripts/test` does it), PostgreSQL
//! at `TEST_DATABASE_URL` (the test creates a database of its own and drops it) and RabbitMQ at
//! `TEST_AMQP_URL` with `rabbitmqctl` on the PATH (the test uses its own exchange and queue
//! prefix, and deletes its queues).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hexeract::Envelope;
use hexeract_tests::http::{free_port, request, wait_for_status};
use serde_json::Value;
use uuid::Uuid;

/// The example's binary, beside this test's in the target directory.
fn example_binary() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/orders_example-<hash> -> target/<profile>/examples/orders
    let profile = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let binary = profile
        .join("examples")
        .join(format!("orders{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: build the example first with `cargo build --example orders` (scripts/test \
         does it)",
        binary.display()
    );
    binary
}

/// A database of the test's own on the test server, dropped by [`Database::drop_database`].
struct Database {
    admin: sqlx::PgPool,
    name: String,
    url: String,
}

impl Database {
    async fn create() -> Database {
        let admin = hexeract_tests::pg::connect("orders-example-test", 2).await;
        let name = format!("orders_{}", Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect(
                "CREATE DATABASE (the TEST_DATABASE_URL user must be allowed to create databases)",
            );
        let base = hexeract_tests::pg::database_url();
        let (server, query) = match base.split_once('?') {
            Some((server, query)) => (server.to_owned(), format!("?{query}")),
            None => (base.clone(), String::new()),
        };
        let server = server
            .rsplit_once('/')
            .map_or(server.as_str(), |(server, _)| server);
        Database {
            admin,
            url: format!("{server}/{name}{query}"),
            name,
        }
    }

    async fn drop_database(&self) {
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&self.admin)
        .await
        .expect("DROP DATABASE");
    }
}

/// The running example and the ports it serves.
struct Shop {
    child: Child,
    http: u16,
    /// WORKER_PORT, which the example leaves unbound (it serves health on `http`).
    worker: u16,
    env: Vec<(&'static str, String)>,
}

impl Shop {
    fn start(database: &Database, prefix: &str) -> Shop {
        let http = free_port();
        let worker = free_port();
        let env = vec![
            ("DATABASE_URL", database.url.clone()),
            ("AMQP_URL", hexeract_tests::amqp::amqp_url()),
            ("HEXERACT_EXCHANGE", format!("{prefix}.x")),
            ("HEXERACT_QUEUE_PREFIX", prefix.to_owned()),
            ("HTTP_PORT", http.to_string()),
            // Set, so that the test can check the example does not bind it.
            ("WORKER_PORT", worker.to_string()),
            ("CART_TTL_SECS", "3".to_owned()),
            ("RUST_LOG", "info,sqlx=warn".to_owned()),
        ];
        let child = Command::new(example_binary())
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .env_remove("HEXERACT_SQLITE_PATH")
            .stdin(Stdio::null())
            .spawn()
            .expect("the example starts");
        Shop {
            child,
            http,
            worker,
            env,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|body| body.to_string());
        let (status, text) = request(self.http, method, path, body.as_deref())
            .await
            .unwrap_or_else(|| panic!("{method} {path}: no answer"));
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: {status}, not JSON: {text:?}"));
        (status, json)
    }

    /// A cart holding `items`, checked out by `email`: the order's id.
    async fn order(&self, items: &[(&str, i32)], email: &str) -> Uuid {
        let (status, cart) = self.call("POST", "/carts", None).await;
        assert_eq!(status, 201, "{cart}");
        let cart = cart["cart_id"].as_str().unwrap().to_owned();
        for (sku, quantity) in items {
            let (status, body) = self
                .call(
                    "PUT",
                    &format!("/carts/{cart}/items/{sku}"),
                    Some(serde_json::json!({ "quantity": quantity })),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
        let (status, placed) = self
            .call(
                "POST",
                &format!("/carts/{cart}/checkout"),
                Some(serde_json::json!({ "email": email })),
            )
            .await;
        assert_eq!(status, 201, "{placed}");
        assert_eq!(placed["status"], "placed");
        placed["order_id"].as_str().unwrap().parse().unwrap()
    }

    /// Waits up to 30 s for the order to reach `status`; returns the order.
    async fn wait_for_order(&self, order: Uuid, status: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (code, body) = self.call("GET", &format!("/orders/{order}"), None).await;
            assert_eq!(code, 200, "{body}");
            if body["status"] == status {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "order {order} is not {status} within 30 s: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stock(&self) -> Vec<(String, i64)> {
        let (status, products) = self.call("GET", "/products", None).await;
        assert_eq!(status, 200);
        products
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["sku"].as_str().unwrap().to_owned(),
                    p["in_stock"].as_i64().unwrap(),
                )
            })
            .collect()
    }

    /// The binary's operations command `args`, with the service's environment: its stdout.
    fn command(&self, args: &[&str]) -> String {
        let output = Command::new(example_binary())
            .args(args)
            .envs(self.env.iter().map(|(name, value)| (*name, value.as_str())))
            .env("RUST_LOG", "warn")
            .output()
            .expect("the example runs a command");
        assert!(
            output.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// `hexeract_messages_handled_total` of `handler` in `/metrics`.
    async fn handled(&self, handler: &str) -> u64 {
        let (status, text) = hexeract_tests::http::get(self.http, "/metrics")
            .await
            .expect("/metrics answers");
        assert_eq!(status, 200);
        let series = format!("hexeract_messages_handled_total{{handler=\"{handler}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map_or(0, |count| count.trim().parse().unwrap())
    }
}

impl Drop for Shop {
    /// A test that failed half-way leaves no shop running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orders_example_takes_orders_reserves_stock_confirms_and_expires_carts() {
    let database = Database::create().await;
    let prefix = format!("t{}", Uuid::now_v7().simple());
    let mut shop = Shop::start(&database, &prefix);
    // Ready: the relay, both consumers and the scheduler have each finished a pass.
    // Health, readiness and metrics are served on the API's port; WORKER_PORT is not bound.
    wait_for_status(shop.http, "/health/ready", 200, Duration::from_secs(60)).await;
    assert_eq!(
        hexeract_tests::http::get(shop.worker, "/health").await,
        None,
        "the example serves one port"
    );
    let stock_before = shop.stock().await;
    assert_eq!(
        stock_before,
        [
            ("mug".to_owned(), 10),
            ("sticker".to_owned(), 100),
            ("tshirt".to_owned(), 3)
        ]
    );

    // 1. A checkout: stock reserved, then one confirmation mail.
    let ada = shop
        .order(&[("mug", 2), ("tshirt", 1)], "ada@example.com")
        .await;
    let confirmed = shop.wait_for_order(ada, "confirmed").await;
    assert_eq!(confirmed["total_cents"], 2 * 1200 + 2500);
    assert_eq!(
        confirmed["mail"].as_array().unwrap().len(),
        1,
        "{confirmed}"
    );
    assert_eq!(confirmed["mail"][0]["to"], "ada@example.com");
    let after_ada = [
        ("mug".to_owned(), 8),
        ("sticker".to_owned(), 100),
        ("tshirt".to_owned(), 2),
    ];
    assert_eq!(shop.stock().await, after_ada);

    // 2. The same OrderPlaced delivered again (as after a crash before its ack): the inbox
    // makes it a no-op.
    let (message_id,): (Uuid,) = sqlx::query_as(
        "SELECT message_id FROM hexeract.inbox WHERE handler = 'shop.reserve_stock'",
    )
    .fetch_one(&sqlx::PgPool::connect(&database.url).await.unwrap())
    .await
    .expect("one inbox mark of reserve_stock");
    let handled_before = shop.handled("shop.reserve_stock").await;
    let mut again = Envelope::from_raw(
        "shop.OrderPlaced",
        serde_json::json!({
            "order_id": ada,
            "email": "ada@example.com",
            "total_cents": 4900,
            "lines": [{ "sku": "mug", "quantity": 2 }, { "sku": "tshirt", "quantity": 1 }],
        })
        .to_string()
        .into_bytes(),
    );
    again.id = message_id;
    // The same message, so the same headers: the API's says which shop it is for (the shop's
    // middleware dead-letters a message without it).
    let again = again.with_header("shop", "main");
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    hexeract::outbox::enqueue_envelopes(&mut tx, "hexeract", &[again])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while shop.handled("shop.reserve_stock").await <= handled_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the redelivery was not handled in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shop.stock().await, after_ada, "a redelivery takes no stock");
    let still = shop.wait_for_order(ada, "confirmed").await;
    assert_eq!(
        still["mail"].as_array().unwrap().len(),
        1,
        "no second mail: {still}"
    );

    // 3. Short of stock: rejected, and nothing is taken.
    let greedy = shop
        .order(&[("sticker", 5), ("tshirt", 5)], "bob@example.com")
        .await;
    let rejected = shop.wait_for_order(greedy, "rejected").await;
    assert_eq!(rejected["status_detail"], "out of stock: tshirt");
    assert_eq!(shop.stock().await, after_ada);

    // 4. A confirmation that can never be delivered: dead-lettered with its reason.
    let lost = shop.order(&[("sticker", 1)], "grace@shop.invalid").await;
    shop.wait_for_order(lost, "reserved").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let listed = shop.command(&["dead-letters", "list", "--reason", "undeliverable_address"]);
        if listed.contains("1 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter within 30 s: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(listed.contains("shop.StockReserved"), "{listed}");
    assert!(listed.contains("shop.send_confirmation"), "{listed}");
    assert!(
        listed.contains("grace@shop.invalid is under the .invalid domain"),
        "{listed}"
    );

    // 4b. The shop's middleware: an order of another shop is dead-lettered with its reason,
    // before the handler takes any stock.
    let stock_before = shop.stock().await;
    let stranger = Envelope::from_raw(
        "shop.OrderPlaced",
        serde_json::json!({
            "order_id": uuid::Uuid::now_v7(),
            "email": "eve@example.com",
            "total_cents": 900,
            "lines": [{ "sku": "mug", "quantity": 1 }],
        })
        .to_string()
        .into_bytes(),
    )
    .with_header("shop", "another-shop");
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    hexeract::outbox::enqueue_envelopes(&mut tx, "hexeract", &[stranger])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let listed = shop.command(&["dead-letters", "list", "--reason", "wrong_shop"]);
        if listed.contains("1 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no wrong_shop dead letter within 30 s: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(listed.contains("shop.reserve_stock"), "{listed}");
    assert!(
        listed.contains("the message is for shop \"another-shop\"; this is shop \"main\""),
        "{listed}"
    );
    assert_eq!(
        shop.stock().await,
        stock_before,
        "no stock taken for another shop"
    );

    // 5. A cart nobody touches for CART_TTL_SECS (3 s) is deleted by the scheduled job.
    let (_, cart) = shop.call("POST", "/carts", None).await;
    let cart = cart["cart_id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = shop.call("GET", &format!("/carts/{cart}"), None).await;
        if status == 404 {
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "cart {cart} did not expire in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 6. SIGTERM: exit code 0.
    let pid = shop.child.id().to_string();
    let signalled = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(signalled.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = shop.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the example did not stop within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status}"
    );

    pool.close().await;
    hexeract_tests::amqp::delete_queues_with_prefix(&prefix).await;
    database.drop_database().await;
}
