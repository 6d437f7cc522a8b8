-- A node's figures over time (its page's sparklines, `GET /v1/nodes/{name}/figures`): read by
-- node, newest first.
CREATE INDEX fleet_samples_node ON fleet_samples (node_name, at);
