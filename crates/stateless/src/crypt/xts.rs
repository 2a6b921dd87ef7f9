//! XTS-AES-256 (IEEE 1619-2018) over whole data units whose length is a multiple of 16 bytes,
//! so no ciphertext stealing.
//!
//! Why our own and not `xts-mode`'s `Xts128`: that one encrypts a data unit one 16-byte
//! block per call into the cipher, and AES's vectorized backends pay their setup (round keys
//! broadcast into registers) on every call. Here a data unit's tweaks are computed first, the
//! unit is whitened with them, and the whole unit goes through the cipher in one
//! `encrypt_blocks`, which the backend pipelines 8 or 32 blocks at a time. The mode is a
//! dozen lines of arithmetic; `xts-mode` stays as the reference our tests compare against.

use aes::cipher::array::Array;
use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::Aes256;

const BLOCK: usize = 16;
/// The largest data unit: 4096-byte sectors.
const MAX_UNIT: usize = 4096;

pub struct XtsAes256 {
    data: Aes256,
    tweak: Aes256,
}

impl XtsAes256 {
    /// Key1 (data) and Key2 (tweak), 32 bytes each.
    pub fn new(data_key: &[u8; 32], tweak_key: &[u8; 32]) -> XtsAes256 {
        XtsAes256 {
            data: Aes256::new(&Array::from(*data_key)),
            tweak: Aes256::new(&Array::from(*tweak_key)),
        }
    }

    /// Encrypts one data unit in place; `number` is its tweak (its sector number).
    pub fn encrypt_unit(&self, unit: &mut [u8], number: u128) {
        self.whitened(unit, number, |blocks| self.data.encrypt_blocks(blocks));
    }

    /// Decrypts one data unit in place.
    pub fn decrypt_unit(&self, unit: &mut [u8], number: u128) {
        self.whitened(unit, number, |blocks| self.data.decrypt_blocks(blocks));
    }

    /// XTS's shape, the same both ways: each block j is XORed with T·αʲ, run through the
    /// cipher, and XORed with T·αʲ again, where T = E(Key2, number).
    fn whitened(&self, unit: &mut [u8], number: u128, cipher: impl FnOnce(&mut [aes::Block])) {
        assert!(
            unit.len().is_multiple_of(BLOCK) && !unit.is_empty() && unit.len() <= MAX_UNIT,
            "an XTS data unit of whole blocks, at most {MAX_UNIT} bytes: {}",
            unit.len()
        );
        let mut masks = [0u128; MAX_UNIT / BLOCK];
        let masks = &mut masks[..unit.len() / BLOCK];
        let mut tweak = Array::from(number.to_le_bytes());
        self.tweak.encrypt_block(&mut tweak);
        let mut mask = u128::from_le_bytes(tweak.into());
        for slot in masks.iter_mut() {
            *slot = mask;
            mask = times_alpha(mask);
        }
        xor_masks(unit, masks);
        let (blocks, rest) = Array::slice_as_chunks_mut(unit);
        debug_assert!(rest.is_empty());
        cipher(blocks);
        xor_masks(unit, masks);
    }
}

/// Multiplication by α in GF(2¹²⁸) mod x¹²⁸ + x⁷ + x² + x + 1, on the tweak read as a
/// little-endian integer (IEEE 1619-2018 §5.2).
fn times_alpha(value: u128) -> u128 {
    let carry = value >> 127;
    (value << 1) ^ (carry * 0x87)
}

fn xor_masks(unit: &mut [u8], masks: &[u128]) {
    for (block, mask) in unit.chunks_exact_mut(BLOCK).zip(masks) {
        let value = u128::from_le_bytes(block.try_into().expect("16 bytes")) ^ mask;
        block.copy_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use xts_mode::{get_tweak_default, Xts128};

    fn reference(data_key: &[u8; 32], tweak_key: &[u8; 32]) -> Xts128<Aes256> {
        Xts128::new(
            Aes256::new(&Array::from(*data_key)),
            Aes256::new(&Array::from(*tweak_key)),
        )
    }

    #[test]
    fn alpha_carries_out_of_the_top_bit_into_0x87() {
        assert_eq!(times_alpha(1), 2);
        assert_eq!(times_alpha(1 << 127), 0x87);
        assert_eq!(times_alpha((1 << 127) | 1), 0x87 ^ 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Byte for byte what `xts-mode` makes, both ways, at every unit size we use and at
        /// tweaks up to 2^128 - 1.
        #[test]
        fn matches_the_reference_implementation(
            data_key in any::<[u8; 32]>(),
            tweak_key in any::<[u8; 32]>(),
            number in any::<u128>(),
            large in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let len = if large { 4096 } else { 512 };
            let plain: Vec<u8> = (0..len as u64)
                .map(|i| (seed.wrapping_mul(i + 1).rotate_left((i % 64) as u32) >> 7) as u8)
                .collect();
            let ours = XtsAes256::new(&data_key, &tweak_key);
            let theirs = reference(&data_key, &tweak_key);

            let mut ciphertext = plain.clone();
            ours.encrypt_unit(&mut ciphertext, number);
            let mut expected = plain.clone();
            theirs.encrypt_sector(&mut expected, get_tweak_default(number));
            prop_assert_eq!(&ciphertext, &expected);

            ours.decrypt_unit(&mut ciphertext, number);
            prop_assert_eq!(ciphertext, plain);
        }
    }
}
