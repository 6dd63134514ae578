//! Shape checks made once at load, so that a forward pass never meets a
//! missing or malformed tensor.

use strata_format::Container;
use strata_kernels::Matrix;

use crate::{Error, Result};

/// The matrix `name`, checked to be `[rows, cols]`.
pub fn matrix<'c>(container: &'c Container, name: &str, rows: usize, cols: usize) -> Result<Matrix<'c>> {
    let m = container.dense(name)?;
    if (m.rows, m.cols) != (rows, cols) {
        return Err(Error::Shape { name: name.to_owned(), expected: vec![rows, cols], found: vec![m.rows, m.cols] });
    }
    Ok(m)
}

/// Checks that the matrix `name` is `[rows, cols]` without viewing its bytes,
/// which may be on disk (`strata_format::Embedding::ReadByRow`).
pub fn matrix_shape(container: &Container, name: &str, rows: usize, cols: usize) -> Result<()> {
    let found = &container.dense_entry(name)?.shape;
    if found[..] != [rows, cols] {
        return Err(Error::Shape { name: name.to_owned(), expected: vec![rows, cols], found: found.clone() });
    }
    Ok(())
}

/// The f32 vector `name`, checked to hold `len` values.
pub fn vector<'c>(container: &'c Container, name: &str, len: usize) -> Result<&'c [f32]> {
    let v = container.dense_vec(name)?;
    if v.len() != len {
        return Err(Error::Shape { name: name.to_owned(), expected: vec![len], found: vec![v.len()] });
    }
    Ok(v)
}

/// The gate, up and down matrices of a SwiGLU MLP of width
/// `intermediate_size`, checked, returned as given.
pub fn swiglu_names(c: &Container, names: [String; 3], hidden: usize, intermediate_size: usize) -> Result<[String; 3]> {
    let [gate, up, down] = &names;
    matrix(c, gate, intermediate_size, hidden)?;
    matrix(c, up, intermediate_size, hidden)?;
    matrix(c, down, hidden, intermediate_size)?;
    Ok(names)
}
