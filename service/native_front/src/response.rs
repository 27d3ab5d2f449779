//! Fast-path 200 responses: a job's JSON header and binary parts cut from a batch's outputs.
//!
//! Python hands over, per batch, the JSON prefix up to and including `"outputs":[` and
//! `data` = for each output of the served table (table order) `n_batch × elements × itemsize`
//! bytes, rows in job order. Each job gets
//! `prefix + {"name":…,"datatype":…,"shape":[n(,elements)],"parameters":{"binary_data_size":…}},… + ]}`
//! followed by its rows of each selected output, in the job's requested order.

use crate::config::OutputSpec;
use crate::http;
use std::io::Write;

/// Where each table output's block starts in a batch's `data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLayout {
    /// Images in the batch.
    pub n_batch: usize,
    /// Start of each table output's block.
    pub offsets: Vec<usize>,
    /// The length `data` must have.
    pub total: usize,
}

impl BatchLayout {
    /// The layout of a batch of `n_batch` images.
    pub fn new(table: &[OutputSpec], n_batch: usize) -> BatchLayout {
        let mut offsets = Vec::with_capacity(table.len());
        let mut total = 0;
        for o in table {
            offsets.push(total);
            total += n_batch * o.row_bytes();
        }
        BatchLayout {
            n_batch,
            offsets,
            total,
        }
    }
}

/// Append a job's JSON header (the prefix, one entry per selected output, `]}`) to `out`.
pub fn write_json_header(out: &mut Vec<u8>, prefix: &[u8], table: &[OutputSpec], selected: &[usize], n: usize) {
    out.extend_from_slice(prefix);
    for (i, &j) in selected.iter().enumerate() {
        let o = &table[j];
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(
            out,
            "{{\"name\":\"{}\",\"datatype\":\"{}\",\"shape\":[{n}",
            o.name, o.datatype
        );
        if o.elements > 1 {
            let _ = write!(out, ",{}", o.elements);
        }
        let _ = write!(out, "],\"parameters\":{{\"binary_data_size\":{}}}}}", n * o.row_bytes());
    }
    out.extend_from_slice(b"]}");
}

/// A job's complete HTTP response: rows `row0 .. row0 + n` of the batch.
#[allow(clippy::too_many_arguments)]
pub fn job_response(
    prefix: &[u8],
    table: &[OutputSpec],
    layout: &BatchLayout,
    data: &[u8],
    selected: &[usize],
    row0: usize,
    n: usize,
    request_id: &str,
    close: bool,
) -> Vec<u8> {
    let mut header = Vec::with_capacity(prefix.len() + 96 * selected.len() + 2);
    write_json_header(&mut header, prefix, table, selected, n);
    let binary: usize = selected.iter().map(|&j| n * table[j].row_bytes()).sum();
    let body_len = header.len() + binary;
    let mut out = Vec::with_capacity(256 + body_len);
    http::binary_ok_head(&mut out, header.len(), body_len, request_id, close);
    out.extend_from_slice(&header);
    for &j in selected {
        let row = table[j].row_bytes();
        let start = layout.offsets[j] + row0 * row;
        out.extend_from_slice(&data[start..start + n * row]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::test_config;

    const PREFIX: &str = r#"{"model_name":"m","parameters":{"mc_samples":10,"score_name":"fused","threshold":3.0946506630420596},"outputs":["#;

    #[test]
    fn header_for_one_image_all_outputs() {
        let cfg = test_config();
        let mut out = Vec::new();
        write_json_header(&mut out, PREFIX.as_bytes(), &cfg.outputs, &[0, 1, 2, 3], 1);
        let expected = concat!(
            r#"{"model_name":"m","parameters":{"mc_samples":10,"score_name":"fused","threshold":3.0946506630420596},"outputs":["#,
            r#"{"name":"probabilities","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}},"#,
            r#"{"name":"label","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}},"#,
            r#"{"name":"score","datatype":"FP64","shape":[1],"parameters":{"binary_data_size":8}},"#,
            r#"{"name":"flagged","datatype":"BOOL","shape":[1],"parameters":{"binary_data_size":1}}]}"#
        );
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn response_for_three_images_subset_custom_order() {
        let cfg = test_config();
        // batch of 5 images: a job of 3 at rows 1..4, asking for flagged then probabilities
        let layout = BatchLayout::new(&cfg.outputs, 5);
        assert_eq!(layout.offsets, vec![0, 60, 100, 140]);
        assert_eq!(layout.total, 145);
        let data: Vec<u8> = (0..145u32).map(|i| i as u8).collect();
        let resp = job_response(
            PREFIX.as_bytes(),
            &cfg.outputs,
            &layout,
            &data,
            &[3, 0],
            1,
            3,
            "0123456789abcdef0123456789abcdef",
            false,
        );
        let header = concat!(
            r#"{"model_name":"m","parameters":{"mc_samples":10,"score_name":"fused","threshold":3.0946506630420596},"outputs":["#,
            r#"{"name":"flagged","datatype":"BOOL","shape":[3],"parameters":{"binary_data_size":3}},"#,
            r#"{"name":"probabilities","datatype":"FP32","shape":[3,3],"parameters":{"binary_data_size":36}}]}"#
        );
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(&data[141..144]); // flagged rows 1..4
        body.extend_from_slice(&data[12..48]); // probabilities rows 1..4
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ninference-header-content-length: {}\r\ncontent-length: {}\r\nx-request-id: 0123456789abcdef0123456789abcdef\r\n\r\n",
            header.len(),
            body.len()
        );
        let mut expected = head.into_bytes();
        expected.extend_from_slice(&body);
        assert_eq!(resp, expected);
        let closing = job_response(
            PREFIX.as_bytes(),
            &cfg.outputs,
            &layout,
            &data,
            &[3, 0],
            1,
            3,
            "id",
            true,
        );
        assert!(String::from_utf8_lossy(&closing).contains("x-request-id: id\r\nconnection: close\r\n\r\n{"));
    }
}
