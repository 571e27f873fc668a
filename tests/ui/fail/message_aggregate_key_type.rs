use hexeract::Message;

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "DocumentSigned", aggregate = "document")]
pub struct DocumentSigned {
    #[message(key)]
    pub digest: Vec<u8>,
}

fn main() {}
