//! Limit rules: validation, matching, path normalisation, the SQL rules source and its reload.
