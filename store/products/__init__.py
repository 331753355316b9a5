"""A version's product channels: every photo and text value of every product, and how they are fused.

``channels``     the channel files of a version: written (``write_product_channels``) and read
                 (``ProductChannels``)
``vectors``      vectors grouped by product, searched for each product's best row
``term_hashes``  each text value's terms as 64-bit hashes (the coverage feature)
``hybrid``       the fusion of the channels' scores (features, calibrated models)
"""
