//! A handler that was renamed leaves its queue on the broker: `hexeract::run` warns at startup
//! about every queue an earlier version declared that no registered handler owns (with the
//! messages waiting in it), forgets the remembered queues that are gone, and the `handlers`
//! command lists the same queues.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `rabbitmqctl` on the PATH. The test uses its own exchange, queue prefix and SQLite outbox;
//! nextest runs it in a process of its own, so setting the environment is safe.

use std::time::Duration;

use hexeract::store::DeclaredQueue;
use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::logs::Captured;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "owned.InvoiceDue")]
struct InvoiceDue {
    id: u32,
}

#[handler(message = "owned.InvoiceDue", name = "billing.send_invoice")]
async fn send_invoice(_invoice: InvoiceDue, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn remembered(queue: &str, handler: &str) -> DeclaredQueue {
    DeclaredQueue {
        queue: queue.to_owned(),
        handler: handler.to_owned(),
        message_type: "owned.InvoiceDue".to_owned(),
        declared_at: chrono::Utc::now(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_warns_about_queues_no_handler_owns_and_handlers_lists_them() {
    let logs = Captured::install("hexeract=info");
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-unowned-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::remove_var("DATABASE_URL");
    std::env::remove_var("KAFKA_BROKERS");
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("AMQP_URL", hexeract_tests::amqp::amqp_url());
    std::env::set_var("HEXERACT_EXCHANGE", &broker.exchange);
    std::env::set_var("HEXERACT_QUEUE_PREFIX", &broker.prefix);
    let port = hexeract_tests::http::free_port();
    std::env::set_var("WORKER_PORT", port.to_string());

    // An earlier version had the handler `billing.invoice`; its queue is still there, with 3
    // messages. It also had `billing.remind`, whose queue someone deleted since.
    let old_queue = format!("{}.billing.invoice", broker.prefix);
    let gone_queue = format!("{}.billing.remind", broker.prefix);
    let other_queue = format!("{}x.ledger.post", broker.prefix);
    let store = hexeract::store::default_store().await.unwrap();
    store
        .record_declared_queues(&[
            remembered(&old_queue, "billing.invoice"),
            remembered(&gone_queue, "billing.remind"),
            // Another service's queue, under its own prefix: not looked at.
            remembered(&other_queue, "ledger.post"),
        ])
        .await
        .unwrap();
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .queue_declare(
            old_queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for id in 0..3 {
        broker
            .publish_to(
                "",
                &old_queue,
                format!("{{\"id\":{id}}}").as_bytes(),
                lapin::BasicProperties::default(),
            )
            .await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while broker.ready(&old_queue).await < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "3 messages in {old_queue}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let warning = loop {
        if let Some(line) = logs
            .text()
            .lines()
            .find(|line| line.contains("no registered handler owns this queue"))
        {
            break line.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warning: {}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(warning.contains(&format!("queue={old_queue}")), "{warning}");
    assert!(
        warning.contains("former_handler=billing.invoice"),
        "{warning}"
    );
    assert!(warning.contains("messages=3"), "{warning}");
    assert!(
        !logs.text().contains(&format!("queue={gone_queue}")),
        "a deleted queue is not reported"
    );

    // The store now remembers this version's queue and the old one, not the deleted one.
    let names: Vec<String> = store
        .declared_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|queue| queue.queue)
        .collect();
    let current = format!("{}.billing.send_invoice", broker.prefix);
    assert!(names.contains(&current), "{names:?}");
    assert!(names.contains(&old_queue), "{names:?}");
    assert!(!names.contains(&gone_queue), "{names:?}");
    assert!(
        names.contains(&other_queue),
        "another prefix's queue is neither checked nor forgotten: {names:?}"
    );

    let mut out = String::new();
    hexeract::cli::execute(&["handlers".to_owned()], &mut out)
        .await
        .unwrap();
    assert!(out.contains("queues no handler here owns:"), "{out}");
    assert!(
        out.contains(&format!(
            "{old_queue}  (was billing.invoice, message owned.InvoiceDue)  3 message(s), 0 consumer(s)"
        )),
        "{out}"
    );
    assert!(!out.contains(&format!("{current}  (was")), "{out}");

    cancel.cancel();
    running.await.unwrap().unwrap();
    let _ = channel
        .queue_delete(old_queue.as_str().into(), Default::default())
        .await;
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(&dir);
}
