use hexeract::scheduled;

#[scheduled(every = "1m")]
struct Nightly;

fn main() {}
