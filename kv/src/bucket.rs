//! Opening a KV bucket that the first process to need it creates.

use async_nats::jetstream::{self, context::CreateKeyValueError, kv};

/// Gets the bucket `config.bucket`, creating it with `config` when it does not exist yet. A
/// create that fails (e.g. another replica created the bucket in between) gets the bucket once
/// more; when that fails too, the create's error is returned. What a missing bucket means (fail
/// open, fail closed, process-local state) stays with the caller.
pub async fn get_or_create(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, CreateKeyValueError> {
    if let Ok(store) = js.get_key_value(&config.bucket).await {
        return Ok(store);
    }
    let bucket = config.bucket.clone();
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Another replica may have created it in between.
        Err(e) => js.get_key_value(&bucket).await.map_err(|_| e),
    }
}
