//! `embed_mem` with jemalloc as the process allocator (as the `switchyard` binary has), for
//! comparing the two: `cargo run --release -p switchyard-cache --example embed_mem_je`.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "embed_mem.rs"]
mod measure;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    measure::main()
}
