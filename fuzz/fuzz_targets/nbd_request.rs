#![no_main]
use libfuzzer_sys::fuzz_target;
use strata_nbd::proto::{Request, REQUEST_HEADER_LEN};

// A request header parses or is refused with an errno; what parses re-encodes identically.
fuzz_target!(|data: &[u8]| {
    let Ok(header) = <&[u8; REQUEST_HEADER_LEN]>::try_from(data) else {
        return;
    };
    if let Ok(request) = Request::parse(header) {
        let mut out = bytes::BytesMut::new();
        request.encode(&mut out);
        assert_eq!(&out[..], &data[..]);
    }
});
