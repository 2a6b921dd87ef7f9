// Generates the brick service's gRPC code (tonic) from proto/brick.proto; needs `protoc`.
fn main() {
    println!("cargo:rerun-if-changed=proto/brick.proto");
    tonic_prost_build::compile_protos("proto/brick.proto").expect("proto/brick.proto compiles");
}
