//! The encoder: f16/f32 weights to Escha-W2 codes.
//! - [`tile`]: one 16x16 tile by trellis Viterbi (tail-biting, weighted);
//! - [`layer`]: a projection `W [OC, IC]`: scale choice, rotation, all tiles.
pub mod layer;
pub mod tile;

pub use layer::{effective_weight, encode_layer, EncodedLayer, LayerOptions};
pub use tile::{pack, EncodedTile, TileEncoder};
