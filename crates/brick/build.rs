// Generates the brick service's gRPC code (tonic) from proto/brick.proto; needs `protoc`.
fn main() {
    println!("cargo:rerun-if-changed=proto/brick.proto");
    tonic_prost_build::configure()
        // Write payloads as `Bytes`: handed to the store and the device without a copy.
        .bytes(".")
        // Buffers sized for the data a message carries (rpc/codec.rs says why).
        .codec_path("crate::rpc::codec::WireCodec")
        .compile_protos(&["proto/brick.proto"], &["proto"])
        .expect("proto/brick.proto compiles");
}
