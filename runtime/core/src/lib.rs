pub use mlx_rs;
