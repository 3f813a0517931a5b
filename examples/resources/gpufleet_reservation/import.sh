# The id is the reservation's id (the `id` attribute, or the `id` field of the
# API's ListReservations answer).
terraform import gpufleet_reservation.example <reservation-id>
