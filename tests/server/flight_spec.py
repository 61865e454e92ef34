"""The Flight SQL spec's reference schemas of the metadata commands, nullability included."""

from __future__ import annotations

import pyarrow as pa

UTF8 = pa.utf8()
SPEC = {
    "CommandGetCatalogs": pa.schema([pa.field("catalog_name", UTF8, False)]),
    "CommandGetDbSchemas": pa.schema([pa.field("catalog_name", UTF8), pa.field("db_schema_name", UTF8, False)]),
    "CommandGetTableTypes": pa.schema([pa.field("table_type", UTF8, False)]),
    "CommandGetTables": pa.schema([pa.field("catalog_name", UTF8), pa.field("db_schema_name", UTF8),
                                   pa.field("table_name", UTF8, False), pa.field("table_type", UTF8, False)]),
    "CommandGetPrimaryKeys": pa.schema([pa.field("catalog_name", UTF8), pa.field("db_schema_name", UTF8),
                                        pa.field("table_name", UTF8, False), pa.field("column_name", UTF8, False),
                                        pa.field("key_name", UTF8), pa.field("key_sequence", pa.int32(), False)]),
    "CommandGetXdbcTypeInfo": pa.schema([
        pa.field("type_name", UTF8, False), pa.field("data_type", pa.int32(), False), ("column_size", pa.int32()),
        ("literal_prefix", UTF8), ("literal_suffix", UTF8), ("create_params", pa.list_(pa.field("item", UTF8, False))),
        pa.field("nullable", pa.int32(), False), pa.field("case_sensitive", pa.bool_(), False),
        pa.field("searchable", pa.int32(), False), ("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), False), ("auto_increment", pa.bool_()), ("local_type_name", UTF8),
        ("minimum_scale", pa.int32()), ("maximum_scale", pa.int32()), pa.field("sql_data_type", pa.int32(), False),
        ("datetime_subcode", pa.int32()), ("num_prec_radix", pa.int32()), ("interval_precision", pa.int32())]),
}
FOREIGN_KEYS = pa.schema([
    ("pk_catalog_name", UTF8), ("pk_db_schema_name", UTF8), pa.field("pk_table_name", UTF8, False),
    pa.field("pk_column_name", UTF8, False), ("fk_catalog_name", UTF8), ("fk_db_schema_name", UTF8),
    pa.field("fk_table_name", UTF8, False), pa.field("fk_column_name", UTF8, False),
    pa.field("key_sequence", pa.int32(), False), ("fk_key_name", UTF8), ("pk_key_name", UTF8),
    pa.field("update_rule", pa.uint8(), False), pa.field("delete_rule", pa.uint8(), False)])
SPEC.update({name: FOREIGN_KEYS for name in ("CommandGetImportedKeys", "CommandGetExportedKeys",
                                              "CommandGetCrossReference")})
