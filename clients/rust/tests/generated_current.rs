//! The checked-in protobuf types (`src/gen/`) must be what `prost-build` makes from `proto/` today.
//!
//! Why checked in: a build script would need `protoc` on every machine that builds the crate
//! (also every downstream user); checking the output in keeps `cargo build` protoc-free, and this
//! test (run by `make test`) keeps it current. Regenerate with
//! `PRISM_REGEN=1 cargo test --test generated_current`.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn generate(out: &Path) {
    let root = repo_root();
    let protos = [
        root.join("proto/prism/envelope/v1/envelope.proto"),
        root.join("proto/prism/envelope/draft/envelope.proto"),
    ];
    let mut cfg = prost_build::Config::new();
    cfg.out_dir(out);
    // BTreeMap: maps encode in key order, so one envelope always serializes to the same bytes.
    cfg.btree_map(["."]);
    cfg.compile_protos(&protos, &[root.join("proto")]).expect(
        "prost-build failed: it needs protoc (Debian: apt-get install protobuf-compiler; scripts/ensure-test-deps.sh installs it)",
    );
}

#[test]
fn generated_types_are_current() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    let tmp = std::env::temp_dir().join(format!("prism-rust-gen-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    generate(&tmp);
    let mut stale = Vec::new();
    for name in ["prism.envelope.v1.rs", "prism.envelope.draft.rs"] {
        let fresh = std::fs::read_to_string(tmp.join(name)).unwrap();
        if std::env::var_os("PRISM_REGEN").is_some() {
            std::fs::write(committed.join(name), &fresh).unwrap();
            continue;
        }
        let old = std::fs::read_to_string(committed.join(name)).unwrap_or_default();
        if old != fresh {
            stale.push(name);
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
    assert!(
        stale.is_empty(),
        "src/gen/{stale:?} is stale against proto/: run `PRISM_REGEN=1 cargo test --test generated_current` in clients/rust and commit"
    );
}
