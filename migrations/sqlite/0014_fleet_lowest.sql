-- The fleet page's lowest nodes (`Db::fleet_lowest_nodes`): per key, every node's figures of
-- the last week averaged in one pass over this index in node order, without reading the table.
CREATE INDEX fleet_samples_key_node ON fleet_samples (fkey, node_name, at, value);
